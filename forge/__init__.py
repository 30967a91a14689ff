"""The forgehand host: app, settings, database, accounts, auth, audit, repositories, web, CLI."""
