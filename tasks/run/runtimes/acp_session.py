"""ACP agent sessions across runs (AGENTS.md decision 5). An ACP agent keeps its sessions where it
likes under `$HOME` (the Claude adapter in `~/.claude/projects/`, Codex in `~/.codex/`), so the
whole of the run's `$HOME` is archived after a run (capped; opaque data, never unpacked on the
host) into the task's state directory (`acp-home.tgz`) and unpacked into the next run's fresh
container before `session/load`. The raw JSON-RPC stream of each run is kept beside it (capped).
`acp_mcp_servers` gives a session's `mcpServers` for an MCP client config."""

from typing import Any

from sandbox.spec import HOME_DIR
from tasks.run.runtimes.base import RunContext
from tasks.run.runtimes.claude_session import restore as restore_home
from tasks.run.runtimes.claude_session import save_home

HOME_ARCHIVE = "acp-home.tgz"
HOME_CAP = 64 * 1024 * 1024


async def restore(ctx: RunContext) -> str:
    """The session to load ("" = a new one), its saved `$HOME` unpacked into the fresh one."""
    return await restore_home(ctx, archive_name=HOME_ARCHIVE, agent="agent")


async def keep(ctx: RunContext, session: str, raw: str, *, home_cap: int = HOME_CAP) -> None:
    """Save `$HOME` (capped) and the raw stream into the task's state directory."""
    argv = ["tar", "-C", HOME_DIR, "-czf", "-", "."]
    await save_home(ctx, argv, session=session, raw=raw, archive_name=HOME_ARCHIVE, home_cap=home_cap, agent="agent")


def acp_mcp_servers(config: dict[str, Any] | None) -> list[dict[str, Any]]:
    """An MCP client config (`{"name", "url", "headers": {name: value}}`, the back-channel's
    `mcp_client_config(channel)`) as ACP's `mcpServers` entry of type http; [] for none."""
    if not config or not isinstance(config.get("url"), str):
        return []
    headers: dict[str, Any] = config["headers"] if isinstance(config.get("headers"), dict) else {}
    return [
        {
            "type": "http",
            "name": str(config.get("name") or "forgehand"),
            "url": config["url"],
            "headers": [{"name": str(k), "value": str(v)} for k, v in headers.items()],
        }
    ]
