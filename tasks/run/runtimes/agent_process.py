"""One agent CLI's process in the sandbox, the same way for every CLI runtime (claude-code, codex,
acp): what comes before it (its `$HOME` scrubbed, a configuration written), then the process
spawned in the work tree with the sandbox's remaining time as its timeout (a sandbox failure on the
way: the run fails as one whose agent could not start), driven to an outcome, and killed whatever
the ending before the runtime keeps what it ran (the session, the raw stream)."""

import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

from sandbox import SandboxError
from tasks.core.states import FailureReason
from tasks.run.runtimes.base import Outcome, RunContext, RuntimeUnavailable

# The work tree in the agents image; the CLIs key their saved sessions by it, so it never changes.
WORKDIR = "/workspace"


async def run_agent(
    ctx: RunContext,
    label: str,
    argv: list[str],
    env: dict[str, str],
    *,
    prepare: Callable[[], Awaitable[None]],
    drive: Callable[[Any], Awaitable[Outcome]],
    after: Callable[[], Awaitable[None]] | None = None,
) -> Outcome:
    """`prepare`, spawn `argv`, `drive` the process to the run's outcome; the process is killed
    however that ends and `after` runs then (not when the agent never started)."""
    try:
        await prepare()
        proc = await ctx.sandbox.spawn(argv, env=env, cwd=WORKDIR, timeout=max(1.0, ctx.sandbox.remaining))
    except SandboxError as exc:
        raise RuntimeUnavailable(f"{label} could not start: {exc}", FailureReason.INTERNAL) from exc
    try:
        return await drive(proc)
    finally:
        with contextlib.suppress(Exception):
            await proc.kill()
        if after is not None:
            await after()
