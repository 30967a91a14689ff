"""Claude sessions across runs (AGENTS.md decision 5): the CLI's `$HOME/.claude` saved after a run
into the task's state directory on the host (`claude-home.tgz`, opaque: never unpacked on the
host) and unpacked into the next run's fresh container before `--resume`; the raw stream kept
beside it; and what a resumed (or new) session is told for each kind of run."""

import asyncio
import contextlib
import json
import uuid
from pathlib import Path

from sandbox import SandboxError
from sandbox.spec import HOME_DIR
from tasks.core.states import RunKind
from tasks.core.transcript import Notice, System
from tasks.run.runtimes.base import RunContext
from tasks.run.runtimes.claude_stream import StreamState

HOME_ARCHIVE = "claude-home.tgz"
HOME_CAP = 64 * 1024 * 1024  # the saved session state; larger is not kept (the next run starts afresh)


async def restore(ctx: RunContext, *, archive_name: str = HOME_ARCHIVE, agent: str = "Claude") -> str:
    """The session to resume ("" = a new one), its saved state (`archive_name` in the task's state
    directory) unpacked into the fresh HOME."""
    session = ctx.agent_session_id
    if not session or ctx.state_dir is None:
        return ""
    archive = ctx.state_dir / archive_name
    try:
        data = await asyncio.to_thread(archive.read_bytes)
    except OSError:
        data = b""
    if data:
        result = await ctx.sandbox.exec(["tar", "-C", HOME_DIR, "-xzf", "-"], stdin=data, timeout=120)
        if result.ok:
            return session
    text = f"the saved state of session {session} is missing or unreadable: a new {agent} session starts"
    await ctx.emit("notice", Notice(text=text, level="warning"))
    return ""


async def keep(ctx: RunContext, state: StreamState, raw: str, *, home_cap: int = HOME_CAP) -> None:
    """Save `$HOME/.claude` (capped) and the raw stream into the task's state directory; report
    the CLI version and session on the context."""
    ctx.agent_version = state.version or ctx.agent_version
    if state.session_id:
        ctx.agent_session_id = state.session_id
    script = 'cd "$HOME" && if [ -e .claude.json ]; then set -- .claude.json; fi; exec tar -czf - .claude "$@"'
    await save_home(ctx, ["sh", "-c", script], session=state.session_id, raw=raw, home_cap=home_cap)


async def save_home(
    ctx: RunContext,
    argv: list[str],
    *,
    session: str,
    raw: str,
    archive_name: str = HOME_ARCHIVE,
    home_cap: int = HOME_CAP,
    agent: str = "Claude",
) -> None:
    """The raw stream, then the session's saved state (what `argv` prints in the sandbox, a
    tar.gz, capped) into the task's state directory as `archive_name`."""
    if ctx.state_dir is None:
        return
    with contextlib.suppress(Exception):
        await asyncio.to_thread(_write, ctx.state_dir / "runs" / f"{ctx.gate_ctx.run_uuid}.jsonl", raw)
    if not session:
        return
    try:
        result = await ctx.sandbox.exec(argv, timeout=120, output_cap=home_cap)
    except SandboxError as exc:
        await ctx.emit("notice", Notice(text=f"the {agent} session could not be saved: {exc}", level="warning"))
        return
    if not result.ok or result.truncated_bytes:
        why = f"larger than {home_cap} bytes" if result.truncated_bytes else f"tar exit {result.exit_code}"
        await ctx.emit("notice", Notice(text=f"the {agent} session was not saved ({why})", level="warning"))
        return
    await asyncio.to_thread(_write_bytes, ctx.state_dir / archive_name, result.stdout)
    await ctx.emit(
        "system",
        System(
            phase="agent_session",
            text=f"session {session} saved ({len(result.stdout)} bytes)",
            detail={"session_id": session, "bytes": len(result.stdout)},
        ),
    )


def _write(path: Path, text: str) -> None:
    _write_bytes(path, text.encode())


def _write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}")
    tmp.write_bytes(data)
    tmp.replace(path)


def prompt_of(ctx: RunContext, session: str) -> str:
    """What this run says to the agent (a resumed session already holds the earlier turns)."""
    if not session:
        if ctx.kind is RunKind.START or not ctx.goal:
            return ctx.prompt or ctx.goal
        return f"{ctx.goal}\n\n{ctx.prompt}" if ctx.prompt and ctx.prompt != ctx.goal else ctx.goal
    decided = ctx.approval
    if ctx.kind is RunKind.APPROVAL and decided is not None:
        call = json.dumps(decided.tool_input, ensure_ascii=False, sort_keys=True)
        if decided.approved:
            who = f" ({decided.decided_by})" if decided.decided_by else ""
            return (
                f"A person{who} approved your {decided.tool_name} call with exactly this input: {call}. "
                "Make that call again, with exactly that input, then continue with the task."
            )
        why = decided.reason or "no reason given"
        return (
            f"A person denied your {decided.tool_name} call ({call}); it was not executed. Do not retry it unless "
            f"the user asks; explain this to the user and continue without it. Reason: {why}"
        )
    if ctx.kind is RunKind.RETRY:
        return "The previous attempt ended early. Continue with the goal."
    if ctx.kind is RunKind.ANSWER:
        return f"The user answered your question: {ctx.prompt}"
    return ctx.prompt or "Continue."
