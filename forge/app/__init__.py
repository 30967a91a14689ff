"""Composition only: the app factory (`factory.create_app`), the `forgehand` command (`cli`), the
first-start demo data (`demo`) and the startup heap (`heap`). The only room of `forge` that knows
the other packages (tasks, webhooks, sandbox, egress)."""
