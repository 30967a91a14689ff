"""The `claude-code` runtime: the Claude Code CLI in the agents image, driven over its stdio control
channel and answered on its managed hooks."""
