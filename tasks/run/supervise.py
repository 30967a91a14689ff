"""Supervising a run's runtime: the stop request, the token budget the gateway watches, and the
watchdogs (idle, wall clock, disk limit). A mixin of `Execution`, as `Settling` is: what it
reads is declared here."""

import asyncio
import contextlib
import time
from typing import Any

from forge.core.settings import Settings
from sandbox import Sandbox
from tasks.core.states import FailureReason, RunState
from tasks.core.transcript import Notice
from tasks.core.writer import TranscriptWriter
from tasks.run.gateway import RunChannel
from tasks.run.runtimes.base import Outcome, RunContext, Runtime, RuntimeUnavailable


class Stopped(Exception):
    """The run was asked to stop (or a watchdog stopped it)."""

    def __init__(self, reason: FailureReason | None, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def bypass_text(ctx: RunContext) -> str:
    first = ctx.ledger.first
    if first is None:
        return "a tool call ran without a policy decision"
    return f"policy bypass: the {first.tool_name or 'unnamed'} call {first.tool_use_id or '(no id)'}: {first.reason}"


def bypassed(ctx: RunContext, outcome: Outcome) -> Outcome:
    """The outcome of a run whose ledger tripped: failed `policy_bypass`, whatever the runtime said
    (its summary kept for the reviewer); any other outcome as it is."""
    if not ctx.ledger.tripped.is_set():
        return outcome
    return Outcome(
        status=RunState.FAILED,
        failure_reason=FailureReason.POLICY_BYPASS,
        error=bypass_text(ctx),
        summary=outcome.summary,
        summary_reported=outcome.summary_reported,
        exit_code=outcome.exit_code,
        conversation=outcome.conversation,
    )


def _model_failure(outcome: Outcome) -> bool:
    """A failed outcome the model's side explains (an error, an unreachable endpoint, the budget)."""
    model_reasons = (None, FailureReason.MODEL_ERROR, FailureReason.MODEL_UNREACHABLE, FailureReason.TOKEN_BUDGET)
    return outcome.status is RunState.FAILED and outcome.failure_reason in model_reasons


def refused(outcome: Outcome, channel: RunChannel | None) -> Outcome:
    """A run whose endpoint the gateway refused fails `model_endpoint_refused` with forgehand's own
    reason as its error, however the agent worded the refusal it was answered (Claude Code wraps
    it in its own "API Error" text); any other outcome as it is."""
    if channel is None or not channel.endpoint_refused.is_set() or not _model_failure(outcome):
        return outcome
    outcome.failure_reason, outcome.error = FailureReason.MODEL_ENDPOINT_REFUSED, channel.refusal
    return outcome


def _budget_ends(outcome: Outcome) -> bool:
    """A used-up budget ends the run unless it failed for a reason of its own first."""
    model_reasons = (None, FailureReason.MODEL_ERROR, FailureReason.MODEL_UNREACHABLE, FailureReason.TOKEN_BUDGET)
    return outcome.status is not RunState.FAILED or outcome.failure_reason in model_reasons


class _Waits:
    """What the supervision waits on besides the runtime: the stop request, the gateway's budget
    and its refusal of the endpoint, the ledger's trip."""

    def __init__(self, stop: asyncio.Event, channel: RunChannel | None, ctx: RunContext) -> None:
        never = asyncio.Event
        self.stop = asyncio.ensure_future(stop.wait())
        self.budget = asyncio.ensure_future(channel.budget_exhausted.wait() if channel is not None else never().wait())
        self.bypass = asyncio.ensure_future(ctx.ledger.tripped.wait())
        self.refused = asyncio.ensure_future(channel.endpoint_refused.wait() if channel is not None else never().wait())

    def all(self) -> set[asyncio.Future[Any]]:
        return {self.stop, self.budget, self.bypass, self.refused}

    def cancel(self) -> None:
        for wait in (self.stop, self.budget, self.bypass, self.refused):
            wait.cancel()


class Supervising:
    """The supervision step of `Execution` (what it provisioned, declared here)."""

    settings: Settings
    stop_event: asyncio.Event
    sandbox: Sandbox | None
    writer: TranscriptWriter | None
    channel: RunChannel | None
    runtime: Runtime

    async def _supervise(self, ctx: RunContext) -> Outcome:
        """Run the runtime under the stop request and the watchdogs (idle, wall clock)."""
        assert self.writer is not None
        runtime_task = asyncio.ensure_future(self.runtime.run(ctx))
        waits = _Waits(self.stop_event, self.channel, ctx)
        try:
            return await self._watch(ctx, runtime_task, waits)
        finally:
            waits.cancel()
            if not runtime_task.done():
                await self._wind_down(runtime_task)

    async def _watch(self, ctx: RunContext, runtime_task: asyncio.Future[Outcome], waits: _Waits) -> Outcome:
        """Wake on whatever ends the run, or every half second for the watchdogs; the outcome."""
        deadline = time.monotonic() + self.settings.task_wall_clock_seconds
        warned = False
        while True:
            done, _ = await asyncio.wait({runtime_task, *waits.all()}, timeout=0.5, return_when=asyncio.FIRST_COMPLETED)
            await self._check_channel(ctx, runtime_task, waits, done)
            if runtime_task in done or runtime_task.done():
                return await self._ended(runtime_task)
            if waits.stop in done:
                raise Stopped(None, "stopped by request")
            warned = await self._check_watchdogs(deadline, warned)

    async def _check_channel(
        self, ctx: RunContext, runtime_task: asyncio.Future[Outcome], waits: _Waits, done: set[Any]
    ) -> None:
        """A call that ran without a decision stops the run at once; the gateway's used-up budget
        or refused endpoint give the runtime a moment to end on its own first."""
        channel = self.channel
        if waits.bypass in done and not runtime_task.done():
            # A tool call ran without a decision: whatever else the agent does is unchecked.
            raise Stopped(FailureReason.POLICY_BYPASS, bypass_text(ctx))
        if waits.budget in done and runtime_task not in done:
            # The gateway refused or cut a call: the runtime gets a moment to end on its own
            # (it sees the refusal), else the run is stopped.
            await asyncio.wait({runtime_task}, timeout=5)
            if not runtime_task.done():
                assert channel is not None
                raise Stopped(FailureReason.TOKEN_BUDGET, channel.budget.text)
        if waits.refused in done and runtime_task not in done:
            # Every call would be refused alike: the agent gets a moment to end on its own.
            await asyncio.wait({runtime_task}, timeout=5)
            if not runtime_task.done():
                assert channel is not None
                raise Stopped(FailureReason.MODEL_ENDPOINT_REFUSED, channel.refusal)

    async def _ended(self, runtime_task: asyncio.Future[Outcome]) -> Outcome:
        """The runtime ended: its outcome, unless the disk limit, the budget or the gateway's
        refusal explains the ending better."""
        channel = self.channel
        if self.sandbox is not None and await self.sandbox.check_disk_limit():
            raise Stopped(FailureReason.DISK_LIMIT, self._disk_limit_text())
        try:
            outcome = runtime_task.result()
        except RuntimeUnavailable as exc:
            return Outcome(status=RunState.FAILED, failure_reason=exc.reason, error=str(exc))
        if channel is not None and channel.budget_exhausted.is_set() and _budget_ends(outcome):
            # However the runtime took the refusal or the cut answer, the budget ended the run.
            outcome.status, outcome.failure_reason = RunState.FAILED, FailureReason.TOKEN_BUDGET
            outcome.error = outcome.error if "token budget" in outcome.error else channel.budget.text
        return refused(outcome, channel)

    async def _check_watchdogs(self, deadline: float, warned: bool) -> bool:
        """The disk limit, the wall clock and idleness (warned at two thirds); whether the idle
        warning stands."""
        settings = self.settings
        assert self.writer is not None
        idle = settings.task_idle_seconds
        if self.sandbox is not None and self.sandbox.disk_limit_reached:
            raise Stopped(FailureReason.DISK_LIMIT, self._disk_limit_text())
        now = time.monotonic()
        if now > deadline:
            raise Stopped(
                FailureReason.TIMEOUT,
                f"the run passed its wall-clock limit of {settings.task_wall_clock_seconds} s",
            )
        quiet = now - self.writer.last_activity
        if quiet > idle:
            raise Stopped(FailureReason.IDLE, f"no activity for {idle:g} s: stopped as idle")
        if quiet > idle * 2 / 3 and not warned:
            await self.writer.emit(
                "notice",
                Notice(text=f"no activity for {quiet:.0f} s; the run stops at {idle:g} s", level="warning"),
                activity=False,
            )
            return True
        if quiet < idle * 2 / 3:
            return False
        return warned

    async def _wind_down(self, runtime_task: asyncio.Future[Outcome]) -> None:
        """A runtime still going when the run ends: told to stop (if it can be), its sandbox
        removed, its task cancelled."""
        stopping = getattr(self.runtime, "stopping", None)  # e.g. ACP's session/cancel
        if stopping is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(10):
                    await stopping()
        # Removing the sandbox ends any exec at once; then the runtime task unwinds.
        if self.sandbox is not None:
            with contextlib.suppress(Exception):
                await self.sandbox.remove()
        runtime_task.cancel()
        with contextlib.suppress(BaseException):
            async with asyncio.timeout(30):
                await runtime_task

    def _disk_limit_text(self) -> str:
        return f"the workspace reached its limit of {self.settings.task_workspace_limit_mb} MiB: stopped (disk_limit)"
