"""ACP agent sessions across runs (AGENTS.md decision 5). An ACP agent keeps its sessions where it
likes under `$HOME` (the Claude adapter in `~/.claude/projects/`, Codex in `~/.codex/`), so the
whole of the run's `$HOME` is archived after a run (capped; opaque data, never unpacked on the
host) into the task's state directory (`acp-home.tgz`) and unpacked into the next run's fresh
container before `session/load`. The raw JSON-RPC stream of each run is kept beside it (capped).
`acp_mcp_servers` gives a session's `mcpServers` for an MCP client config."""

import asyncio
import contextlib
from typing import Any

from sandbox import SandboxError
from sandbox.spec import HOME_DIR
from tasks.core.transcript import Notice, System
from tasks.run.runtimes.base import RunContext
from tasks.run.runtimes.claude_session import restore as restore_home
from tasks.run.runtimes.claude_session import write_file

HOME_ARCHIVE = "acp-home.tgz"
HOME_CAP = 64 * 1024 * 1024


async def restore(ctx: RunContext) -> str:
    """The session to load ("" = a new one), its saved `$HOME` unpacked into the fresh one."""
    return await restore_home(ctx, archive_name=HOME_ARCHIVE, agent="agent")


async def keep(ctx: RunContext, session: str, raw: str, *, home_cap: int = HOME_CAP) -> None:
    """Save `$HOME` (capped) and the raw stream into the task's state directory."""
    if ctx.state_dir is None:
        return
    with contextlib.suppress(Exception):
        await asyncio.to_thread(write_file, ctx.state_dir / "runs" / f"{ctx.gate_ctx.run_uuid}.jsonl", raw.encode())
    if not session:
        return
    try:
        result = await ctx.sandbox.exec(["tar", "-C", HOME_DIR, "-czf", "-", "."], timeout=120, output_cap=home_cap)
    except SandboxError as exc:
        await ctx.emit("notice", Notice(text=f"the agent session could not be saved: {exc}", level="warning"))
        return
    if not result.ok or result.truncated_bytes:
        why = f"larger than {home_cap} bytes" if result.truncated_bytes else f"tar exit {result.exit_code}"
        await ctx.emit("notice", Notice(text=f"the agent session was not saved ({why})", level="warning"))
        return
    await asyncio.to_thread(write_file, ctx.state_dir / HOME_ARCHIVE, result.stdout)
    detail = {"session_id": session, "bytes": len(result.stdout)}
    text = f"session {session} saved ({len(result.stdout)} bytes)"
    await ctx.emit("system", System(phase="agent_session", text=text, detail=detail))


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
