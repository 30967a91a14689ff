"""CLI agent sessions across runs (docs/agents.md, "Claude Code: resume"): the part of the CLI's `$HOME` that holds
its sessions (`AgentHome`: `.claude` for Claude Code, `.codex/sessions` for Codex) saved after a
run into the task's state directory on the host (`claude-home.tgz`, `codex-home.tgz`; opaque:
never unpacked on the host) and unpacked into the next run's fresh container before the CLI
resumes; the raw stream kept beside it; and what a resumed (or new) session is told for each kind
of run."""

import asyncio
import contextlib
import json
import shlex
import uuid
from pathlib import Path
from typing import Protocol

import msgspec

from forge.core.text import plural
from sandbox import SandboxError
from sandbox.spec import HOME_DIR
from tasks.core.states import RunKind
from tasks.core.transcript import Notice, System
from tasks.run.runtimes.base import RunContext

HOME_CAP = 64 * 1024 * 1024  # the saved session state; larger is not kept (the next run starts afresh)


class AgentHome(msgspec.Struct, frozen=True, kw_only=True):
    """What of an agent's `$HOME` carries its sessions from one run to the next."""

    label: str  # for notices: "Claude", "Codex"
    archive: str  # the file in the task's state directory
    path: str  # under $HOME, always archived ("" = none: only the optional ones)
    optional: tuple[str, ...] = ()  # under $HOME, archived when present
    # A shell snippet run in $HOME before every start of the CLI: it removes the configuration the
    # agent may have written there in an earlier turn or run (settings that would shape the next
    # process before any policy applies); only session transcripts carry over.
    scrub: str = ""


# Only the session transcripts carry over: `--resume` reads `.claude/projects/<cwd>/<id>.jsonl`
# (measured with 2.1.332: nothing else under `$HOME` is needed, and without `.claude.json` the CLI
# starts clean). Everything else the agent could have written under `$HOME` goes before each start:
# user settings (`--setting-sources user` would load their env and permission rules), skills and
# custom commands (their inline shell), user subagents, plugins, `.claude.json` (trust, MCP servers).
# A `projects` that is a symlink goes too (the CLI would write its sessions wherever it points).
CLAUDE_SCRUB = (
    "mkdir -p .claude && if [ -L .claude/projects ]; then rm -f .claude/projects; fi && "
    "find .claude -mindepth 1 -maxdepth 1 ! -name projects -exec rm -rf {} + && rm -rf .claude.json"
)
CLAUDE_HOME = AgentHome(label="Claude", archive="claude-home.tgz", path=".claude/projects", scrub=CLAUDE_SCRUB)
HOME_ARCHIVE = CLAUDE_HOME.archive


class SessionState(Protocol):
    """What a runtime's stream state reports about the session it ran."""

    @property
    def session_id(self) -> str: ...

    @property
    def version(self) -> str: ...


async def restore(ctx: RunContext, home: AgentHome = CLAUDE_HOME) -> str:
    """The session to resume ("" = a new one), its saved state unpacked into the fresh HOME."""
    session = ctx.agent_session_id
    if not session or ctx.state_dir is None:
        return ""
    archive = ctx.state_dir / home.archive
    try:
        data = await asyncio.to_thread(archive.read_bytes)
    except OSError:
        data = b""
    if data:
        result = await ctx.sandbox.exec(["tar", "-C", HOME_DIR, "-xzf", "-"], stdin=data, timeout=120)
        if result.ok:
            return session
    text = f"the saved state of session {session} is missing or unreadable: a new {home.label} session starts"
    await ctx.emit("notice", Notice(text=text, level="warning"))
    return ""


async def scrub(ctx: RunContext, home: AgentHome) -> None:
    """Run the home's scrub in the sandbox (before each start of the CLI); a failure stops the run."""
    if not home.scrub:
        return
    result = await ctx.sandbox.exec(["sh", "-c", f'cd "$HOME" && {home.scrub}'], timeout=60, env={"HOME": HOME_DIR})
    if not result.ok:
        tail = result.stderr.decode(errors="replace")[-300:]
        raise SandboxError(f"could not clear the agent's configuration from $HOME: {tail}")


async def keep(
    ctx: RunContext, state: SessionState, raw: str, *, home_cap: int = HOME_CAP, home: AgentHome = CLAUDE_HOME
) -> None:
    """Save the agent's session state under `$HOME` (capped) and the raw stream into the task's
    state directory; report the CLI version and session on the context."""
    ctx.agent_version = state.version or ctx.agent_version
    if state.session_id:
        ctx.agent_session_id = state.session_id
    if ctx.state_dir is None:
        return
    with contextlib.suppress(Exception):
        await asyncio.to_thread(_write, ctx.state_dir / "runs" / f"{ctx.gate_ctx.run_uuid}.jsonl", raw)
    if not state.session_id:
        return
    optional = " ".join(shlex.quote(p) for p in home.optional)
    required = shlex.quote(home.path) if home.path else ""
    # `path` must be there (tar fails on it otherwise: nothing to resume); each optional when present;
    # with nothing to archive, tar is not run and there is nothing to resume from.
    script = (
        f'cd "$HOME" && set -- {required} && for p in {optional}; do if [ -e "$p" ]; then set -- "$@" "$p"; fi; '
        'done; if [ "$#" -eq 0 ]; then exit 3; fi; exec tar -czf - "$@"'
    )
    try:
        result = await ctx.sandbox.exec(["sh", "-c", script], timeout=120, output_cap=home_cap)
    except SandboxError as exc:
        await ctx.emit("notice", Notice(text=f"the {home.label} session could not be saved: {exc}", level="warning"))
        return
    if not result.ok or result.truncated_bytes:
        why = f"larger than {home_cap} bytes" if result.truncated_bytes else f"tar exit {result.exit_code}"
        await ctx.emit("notice", Notice(text=f"the {home.label} session was not saved ({why})", level="warning"))
        return
    await asyncio.to_thread(_write_bytes, ctx.state_dir / home.archive, result.stdout)
    await ctx.emit(
        "system",
        System(
            phase="agent_session",
            text=f"session {state.session_id} saved ({plural(len(result.stdout), 'byte')})",
            detail={"session_id": state.session_id, "bytes": len(result.stdout)},
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
