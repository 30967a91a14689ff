"""What a CLI agent's tool does, by its name: the kinds of the Agent Client Protocol (`execute`,
`edit`, `read`, `search`, `fetch`, `think`, `switch_mode`, `other`), for the transcript's tool
cards. One table for the CLIs forgehand runs, by the names their streams and managed hooks use:
Claude Code's (claude-code, and its ACP adapter) and Codex's (codex, and codex-acp's hooks)."""

TOOL_KINDS: dict[str, str] = {
    # Claude Code
    "Bash": "execute",
    "BashOutput": "execute",
    "KillShell": "execute",
    "KillBash": "execute",
    "Monitor": "execute",
    "Edit": "edit",
    "MultiEdit": "edit",
    "Write": "edit",
    "NotebookEdit": "edit",
    "Read": "read",
    "NotebookRead": "read",
    "Glob": "search",
    "Grep": "search",
    "LS": "search",
    "ToolSearch": "search",
    "WebFetch": "fetch",
    "WebSearch": "fetch",
    "Task": "think",
    "Agent": "think",
    "TodoWrite": "think",
    "SendMessage": "think",
    "ExitPlanMode": "switch_mode",
    "EnterPlanMode": "switch_mode",
    # Codex (its hooks name a shell call `Bash` too)
    "exec_command": "execute",
    "write_stdin": "execute",
    "apply_patch": "edit",
    "view_image": "read",
    "web_search": "fetch",
    "update_plan": "think",
}


def tool_kind(name: str) -> str:
    """The kind of a tool call; an MCP server's tool (`mcp__<server>__<tool>`) is `other`."""
    if name.startswith("mcp__"):
        return "other"
    return TOOL_KINDS.get(name, "other")
