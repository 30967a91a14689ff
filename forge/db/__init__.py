"""Persistence and what rides in a change's transaction: the engine and sessions (`engine`), the
host's tables (`models`), the migrations, the event bus (`events`), the audit log (`audit`) and the
network allow-lists every layer above reads (`allowlists`). Knows no HTTP and no git."""
