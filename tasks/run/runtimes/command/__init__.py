"""The `command` runtime: the task's shell command in the sandbox, no model."""
