"""The `builtin` runtime: forgehand's own agent loop on the host (OpenAI-compatible chat completions
through the run's model gateway); tool calls run in the sandbox."""
