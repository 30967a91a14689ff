"""The `forgehand` command groups that work on an existing instance, one module per area
(`accounts`: users, bots and tokens; `repos`; `audit`), and what they share (`context`). The root
command and the commands that start a process (`serve`, `worker`, `db upgrade`) are `forge.app.cli`."""
