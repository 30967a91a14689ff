"""The `codex` runtime: the Codex CLI in the agents image (`codex exec --json`), answered on its
managed hooks."""
