"""ACP agent sessions across runs (docs/agents.md, "ACP agents"). An ACP agent keeps its sessions where it
likes under `$HOME` (the Claude adapter in `~/.claude/projects/`, Codex in `~/.codex/sessions/`);
those are archived after a run (capped; opaque data, never unpacked on the host) into the task's
state directory (`acp-home.tgz`) and unpacked into the next run's fresh container before
`session/load`, and the configuration an agent could have written beside them (anything in
`~/.claude` but its transcripts, `~/.claude.json`, anything in `~/.codex` but its sessions) is
removed before each start. The rest of `$HOME` (rc files, trust lists) never carries over. The raw
JSON-RPC stream of each run is kept beside it (capped). `acp_mcp_servers` gives a session's
`mcpServers` for an MCP client config."""

from dataclasses import dataclass
from typing import Any

from tasks.core.agent_registry import AcpAgent
from tasks.run.runtimes.agent_session import CLAUDE_HOME, AgentHome
from tasks.run.runtimes.agent_session import keep as keep_home
from tasks.run.runtimes.agent_session import restore as restore_home
from tasks.run.runtimes.base import RunContext

HOME_CAP = 64 * 1024 * 1024
HOME_ARCHIVE = "acp-home.tgz"
# Before each start: anything in ~/.claude but its session transcripts, ~/.claude.json, and anything
# in ~/.codex but its sessions go (an agent could have written them in an earlier run; they would
# shape the next process before any policy).
SCRUB = (
    f"{CLAUDE_HOME.scrub}; "
    "if [ -L .codex/sessions ]; then rm -f .codex/sessions; fi; "
    "if [ -d .codex ]; then find .codex -mindepth 1 -maxdepth 1 ! -name sessions -exec rm -rf {} +; fi"
)


def home_of(agent: AcpAgent) -> AgentHome:
    """What of `$HOME` carries the agent's sessions: its configured `session_paths`, each when present."""
    return AgentHome(label=agent.name, archive=HOME_ARCHIVE, path="", optional=agent.session_paths, scrub=SCRUB)


@dataclass(frozen=True)
class _Saved:
    session_id: str
    version: str


async def restore(ctx: RunContext, agent: AcpAgent) -> str:
    """The session to load ("" = a new one), its saved state unpacked into the fresh `$HOME`."""
    return await restore_home(ctx, home_of(agent))


async def keep(ctx: RunContext, agent: AcpAgent, session: str, raw: str, *, home_cap: int = HOME_CAP) -> None:
    """Save the agent's sessions under `$HOME` (capped) and the raw stream into the task's state directory."""
    await keep_home(ctx, _Saved(session, ctx.agent_version), raw, home_cap=home_cap, home=home_of(agent))


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
