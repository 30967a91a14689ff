"""One `codex exec` process of a codex run: its stdout read and normalised, the watchdogs (no final
line, stdout silence, a process that lingers after its turn ended, a turn that goes on after a
stopping refusal) and the run's outcome from how it ended."""

import asyncio
import contextlib
import time
from typing import Any, Protocol

from tasks.core.capping import HeadTail
from tasks.core.states import FailureReason, RunState
from tasks.run.runtimes.base import Outcome, RunContext
from tasks.run.runtimes.cli_lines import StdoutReader
from tasks.run.runtimes.codex.stream import StreamState
from tasks.run.runtimes.policy_broker import PolicyBroker
from tasks.run.runtimes.policy_steps import verify

_UNREACHABLE = ("connection", "disconnected", "timed out", "timeout", "status 502", "status 503", "status 504")


class TurnTimings(Protocol):
    """What a turn reads of its runtime (codex/runtime.py's `CodexRuntime` is one)."""

    idle_seconds: float
    linger_seconds: float
    stop_grace: float


class CodexTurn:
    def __init__(
        self, runtime: TurnTimings, ctx: RunContext, broker: PolicyBroker, raw: HeadTail, state: StreamState
    ) -> None:
        self.runtime = runtime
        self.ctx = ctx
        self.broker = broker
        self.raw = raw
        self.state = state
        self.proc: Any = None

    def _ending(self) -> bool:
        return self.broker.ending

    async def run(self, proc: Any) -> Outcome:
        self.proc = proc
        ctx, state, runtime = self.ctx, self.state, self.runtime
        with contextlib.suppress(Exception):
            await proc.close_stdin()  # a piped stdin would be read into the prompt
        reader = StdoutReader(proc)
        # A tool call may run silently up to its own timeout: silence is judged beyond that.
        idle = max(runtime.idle_seconds, ctx.limits.tool_timeout + 30)
        watchdog: tuple[FailureReason, str] | None = None
        ending_since: float | None = None  # when a refusal ended the run (parked, failed policy)
        cut = False
        completed_before = state.completed
        last = time.monotonic()
        try:
            while True:
                now = time.monotonic()
                if ending_since is None and self._ending():
                    ending_since = now
                deadline = last + (runtime.linger_seconds if state.final else idle)
                if ending_since is not None and not state.final:
                    deadline = min(deadline, ending_since + runtime.stop_grace)
                if deadline <= now:
                    if ending_since is not None and not state.final:
                        cut = True  # the run is blocked or failed already: the turn is cut short
                    elif state.final:
                        watchdog = (
                            FailureReason.AGENT_LINGERED,
                            f"codex was still running {runtime.linger_seconds:g} s after its turn ended: killed",
                        )
                    else:
                        watchdog = (FailureReason.IDLE, f"codex printed nothing for {idle:g} s: killed as idle")
                    break
                try:
                    lines = await reader.next_lines(min(deadline - now, 1.0))
                except TimeoutError:
                    continue
                last = time.monotonic()
                if lines is None:
                    break
                events = state.feed_lines(lines, self.raw)
                for ran in state.take_ran():  # matched to the calls the hook allowed (stream.py)
                    events += verify(ctx, ran.id, ran.name, error=ran.error)
                await ctx.emit_all(events)
        finally:
            if watchdog is not None or cut:
                with contextlib.suppress(Exception):
                    await proc.kill()
            await reader.close()
        exit_code: int | None = None
        with contextlib.suppress(Exception):
            async with asyncio.timeout(runtime.linger_seconds):
                exit_code = await proc.wait()
        if exit_code is None and watchdog is None and state.final:
            watchdog = (
                FailureReason.AGENT_LINGERED,
                f"codex was still running {runtime.linger_seconds:g} s after its turn ended: killed",
            )
        return await self._outcome(watchdog, exit_code, state.completed > completed_before)

    async def _outcome(self, watchdog: tuple[FailureReason, str] | None, exit_code: int | None, done: bool) -> Outcome:
        state = self.state
        ended = await self.broker.ended(exit_code)
        if ended is not None:
            return ended
        if watchdog is not None:
            return Outcome(status=RunState.FAILED, failure_reason=watchdog[0], error=watchdog[1], exit_code=exit_code)
        if state.failure and not done:
            text = state.failure.lower()
            unreachable = any(w in text for w in _UNREACHABLE)
            reason = FailureReason.MODEL_UNREACHABLE if unreachable else FailureReason.MODEL_ERROR
            return Outcome(
                status=RunState.FAILED, failure_reason=reason, error=f"codex: {state.failure[:2000]}",
                exit_code=exit_code,
            )  # fmt: skip
        if not done:
            tail = (getattr(self.proc, "stderr_tail", "") or "").strip()[-1000:]
            text = f"codex exited (code {exit_code}) without ending its turn" + (f": {tail}" if tail else "")
            return Outcome(
                status=RunState.FAILED, failure_reason=FailureReason.AGENT_NO_RESULT, error=text, exit_code=exit_code
            )
        if exit_code not in (0, None):
            return Outcome(
                status=RunState.FAILED, failure_reason=FailureReason.EXIT_CODE,
                error=f"codex exited with code {exit_code} after its turn", exit_code=exit_code,
            )  # fmt: skip
        return Outcome(status=RunState.SUCCEEDED, summary=state.last_message, exit_code=exit_code)
