"""One run's execution, from claimed to settled: load what the run needs, provision the workspace
and the sandbox (after the policy's `session_start`), run the runtime under the stop request and
the watchdogs (idle, wall clock), then settle (tasks/run/settle.py). Given a `RunEnv`, never the
worker."""

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

import msgspec
import structlog
from sqlalchemy import select, update

from forge.db import events
from forge.db.models import Account, Repository
from forge.db.payload_base import TriggerRef
from forge.git.errors import RepoNotFound
from sandbox import (
    Sandbox,
)
from tasks.core import egress_config, environment_images, repo_settings
from tasks.core.models import Approval, RepoTaskSettings, Run, Task
from tasks.core.policy import ApprovedCall, GateContext
from tasks.core.redaction import Redactor, redact_value
from tasks.core.states import ApprovalState, FailureReason, RunKind, RunState
from tasks.core.transcript import System
from tasks.core.writer import TranscriptWriter
from tasks.run import gitops
from tasks.run.backchannel import Backchannel
from tasks.run.egress import RunEgress
from tasks.run.env import RunEnv
from tasks.run.gateway import RunChannel
from tasks.run.outside import ProvisionFailed
from tasks.run.provision import Provisioning
from tasks.run.runtimes.base import Outcome, RunContext
from tasks.run.settle import Settling
from tasks.run.supervise import Stopped, Supervising, bypassed

log = structlog.get_logger("forgehand.tasks")


BYPASS_NOTIFICATIONS = 10  # `policy.bypassed` notifications of one run at most (the transcript has all)


def _ms(t0: float) -> int:
    return int((time.monotonic() - t0) * 1000)


class Execution(Settling, Supervising, Provisioning):
    """One run, from claimed to settled."""

    def __init__(self, env: RunEnv, run_id: int, stop: asyncio.Event) -> None:
        self.env = env
        self.settings = env.settings  # until the repository's overrides are loaded
        self.run_id = run_id
        self.stop_event = stop
        self.sandbox: Sandbox | None = None
        self.workspace: Path | None = None
        self.checkout: gitops.Checkout | None = None
        self.start_sha = ""
        self.writer: TranscriptWriter | None = None
        self.turns = self.prompt_tokens = self.completion_tokens = 0
        self.channel: RunChannel | None = None
        self.egress: RunEgress | None = None
        self.backchannel: Backchannel | None = None

    async def _load(self) -> None:
        async with self.env.db.session() as s:
            run = await s.get(Run, self.run_id)
            assert run is not None
            task = await s.get(Task, run.task_id)
            assert task is not None
            repo = await s.get(Repository, run.repo_id)
            assert repo is not None
            agent = await s.get(Account, task.agent_id)
            starter = await s.get(Account, run.requested_by_id) if run.requested_by_id else None
            self.run_uuid, self.run_seq, self.kind = run.uuid, run.seq, RunKind(run.kind)
            self.prompt = run.prompt
            self.task_id, self.task_uuid, self.number = task.id, task.uuid, task.number
            self.title, self.goal, self.runtime_name = task.title, task.goal, task.runtime
            self.command = task.command
            parent = await s.get(Task, task.parent_id) if task.parent_id is not None else None
            self.parent_number = parent.number if parent is not None else None
            self.trigger = msgspec.convert(task.trigger, TriggerRef) if task.trigger else None
            self.branch, self.base_sha = task.branch, task.base_sha
            self.environment_override = task.environment_override
            self.conversation = list(task.conversation or [])
            self.agent_session_id = task.agent_session_id
            self.approved: ApprovedCall | None = None
            if self.kind is RunKind.APPROVAL:
                decided = (
                    await s.execute(select(Approval).where(Approval.resume_run_id == run.id))
                ).scalar_one_or_none()
                if decided is not None:
                    decider = await s.get(Account, decided.decided_by_id) if decided.decided_by_id else None
                    self.approved = ApprovedCall(
                        tool_use_id=decided.tool_use_id,
                        tool_name=decided.tool_name,
                        tool_input=dict(decided.tool_input or {}),
                        input_hash=decided.input_hash,
                        approved=decided.state == ApprovalState.APPROVED,
                        decided_by=decider.login if decider else "",
                        reason=decided.decision_reason,
                    )
            self.repo_key = (repo.owner.login.lower(), repo.name.lower())
            self.default_branch = repo.default_branch
            self.full_name = f"{repo.owner.login}/{repo.name}"
            self.repo_uuid = repo.uuid
            # The instance's settings with this repository's overrides (model endpoint, limits).
            self.settings = await repo_settings.effective(s, self.env.settings, repo.id)
            if task.token_budget is not None:  # a subtask's own budget, carved out of its parent's
                limit = self.settings.task_token_budget
                mine = min(task.token_budget, limit) if limit else task.token_budget
                self.settings = msgspec.structs.replace(self.settings, task_token_budget=mine)
            # Which key pays for the run's model calls, per provider (the gateway injects it).
            self.access = await repo_settings.model_access(s, self.env.settings, repo.id, run.requested_by_id)
            # Network access through the egress proxy (None: off, the sandbox reaches nothing).
            row = await s.get(RepoTaskSettings, repo.id)
            setting = egress_config.from_stored(row.egress if row is not None else None)
            self.egress_plan = egress_config.plan(setting, self.env.settings)
            self.environment_generation = row.environment_generation if row is not None else 0
            self.environment_yml = row.environment_yml if row is not None else None
            self.registered_images = tuple(await environment_images.registered(s))
            self.repo_id = repo.id
            self.agent_login = agent.login if agent else "agent"
            self.starter_login = starter.login if starter else ""
            self.starter_type = "Bot" if starter is not None and starter.is_bot else "User"

    def gate_ctx(self) -> GateContext:
        base = self.env.settings.effective_base_url
        return GateContext(
            repository=self.full_name,
            repo_uuid=self.repo_uuid,
            task_uuid=self.task_uuid,
            task_number=self.number,
            task_url=f"{base}/{self.full_name}/tasks/{self.number}",
            run_uuid=self.run_uuid,
            run_seq=self.run_seq,
            actor_login=self.starter_login,
            actor_type="Bot" if self.starter_type == "Bot" else "User",
            agent_login=self.agent_login,
            parent_number=self.parent_number,
            trigger=self.trigger,
        )

    async def system(self, phase: str, text: str, t0: float | None = None, **detail: Any) -> None:
        assert self.writer is not None
        await self.writer.emit(
            "system", System(phase=phase, text=text, duration_ms=_ms(t0) if t0 is not None else None, detail=detail)
        )

    async def run(self) -> None:
        await self._load()
        settings = self.settings
        keys = [a.api_key for a in self.access.values()]
        redactor = self.redactor = Redactor(
            [settings.model_api_key, settings.secret_key, *keys, *self.env.extra_secrets]
        )
        self.writer = TranscriptWriter(self.env.db, self.env.hub, self.task_id, self.run_id, redactor)
        self.writer.start()
        outcome: Outcome
        stopped = False
        cancelled = False
        ctx: RunContext | None = None
        try:
            await self.system(
                "claimed",
                f"run {self.run_seq} ({self.kind.value}) claimed by worker {self.env.worker_id}",
                worker=self.env.worker_id,
            )
            ctx = await self._provision()
            outcome = await self._supervise(ctx)
        except Stopped as exc:
            stopped = exc.reason is None
            outcome = Outcome(status=RunState.FAILED, failure_reason=exc.reason, error=str(exc))
        except ProvisionFailed as exc:
            outcome = Outcome(status=RunState.FAILED, failure_reason=exc.reason, error=str(exc))
        except asyncio.CancelledError:
            cancelled = True
            outcome = Outcome(
                status=RunState.FAILED,
                failure_reason=FailureReason.INTERRUPTED,
                error="interrupted: the worker shut down",
            )
        except RepoNotFound:
            # The database knows the repository; this host does not have it: a worker host without
            # the shared storage (docs/operator.md, "Past one machine").
            where = self.env.store.root
            outcome = Outcome(
                status=RunState.FAILED,
                failure_reason=FailureReason.WORKSPACE,
                error=f"the repository {getattr(self, 'full_name', '')} is not in this worker's repositories' "
                f"directory ({where}): "
                "mount the shared data directory on this worker's host (`forgehand doctor` checks it there)",
            )
        except Exception as exc:
            log.exception("run failed unexpectedly", run_id=self.run_id)
            outcome = Outcome(
                status=RunState.FAILED,
                failure_reason=FailureReason.INTERNAL,
                error=f"internal error: {type(exc).__name__}",
            )
        if ctx is not None and ctx.ledger.tripped.is_set():
            # A tool call ran without a decision: the run fails, however it ended (a stop included);
            # its work is kept as a work-in-progress commit for inspection, never for review.
            outcome, stopped = bypassed(ctx, outcome), False
            with contextlib.suppress(Exception):
                await self._notify_bypasses(ctx)
        if ctx is not None:
            self.turns, self.prompt_tokens, self.completion_tokens = ctx.turns, ctx.prompt_tokens, ctx.completion_tokens
            with contextlib.suppress(Exception):
                await self._record_agent(ctx)
        # Settle even when cancelled: shield the cleanup so a shutdown cannot leave a container behind.
        settle = asyncio.ensure_future(self._end(outcome, stopped))
        try:
            await asyncio.shield(settle)
        except asyncio.CancelledError:
            cancelled = True
            await settle
        if cancelled:
            raise asyncio.CancelledError

    async def _notify_bypasses(self, ctx: RunContext) -> None:
        """A `policy.bypassed` notification per call that ran without a decision (the first few)."""
        async with self.env.db.session(write=True) as s:
            task, repo, run = (
                await s.get(Task, self.task_id),
                await s.get(Repository, self.repo_id),
                await s.get(Run, self.run_id),
            )
            if task is None or repo is None or run is None:
                return
            life = self.env.lifecycle(s)
            for bypass in ctx.ledger.bypasses[:BYPASS_NOTIFICATIONS]:
                data = events.PolicyBypassed(
                    tool_use_id=bypass.tool_use_id[:200],
                    tool_name=bypass.tool_name[:200],
                    tool_input=redact_value(self.redactor, bypass.tool_input),  # as the transcript shows it
                    reason=bypass.reason,
                )
                await life.publish("policy.bypassed", task, repo, run=run, data=data)

    async def _end(self, outcome: Outcome, stopped: bool) -> None:
        """Close the run's egress proxy and channel first (its token dies with it, whatever the
        ending), record what the gateway metered and the proxy counted, then settle."""
        egress, self.egress = self.egress, None
        if egress is not None:
            try:
                await egress.close()
            except Exception:
                log.exception("closing the run's egress proxy failed", run_id=self.run_id)
            await self._set_run(egress_allowed=egress.allowed, egress_blocked=egress.blocked)
        channel, self.channel = self.channel, None
        if channel is not None:
            try:
                await channel.close()
            except Exception:
                log.exception("closing the run's channel failed", run_id=self.run_id)
            if self.backchannel is not None:
                # Nothing is taken from now on: the summary stored below is the one reported, once.
                self.backchannel.seal()
                if self.backchannel.custom is not None:  # tool runs still waiting or running: cancelled, removed
                    await self.backchannel.custom.close()
                if self.backchannel.summary is not None:
                    outcome.summary, outcome.summary_reported = self.backchannel.summary, True
                no_review = self.backchannel.review_pull is not None and self.backchannel.review is None
                if no_review and outcome.status is RunState.SUCCEEDED and not stopped:
                    outcome.status, outcome.failure_reason = RunState.FAILED, FailureReason.AGENT_NO_RESULT
                    outcome.error = "the review task's run ended without a review: its agent never called submit_review"
            usage = channel.usage
            await self._set_run(
                input_tokens=usage.input_tokens,
                output_tokens=usage.output_tokens,
                cache_read_tokens=usage.cache_read_tokens,
                cache_write_tokens=usage.cache_write_tokens,
                cost_micros=channel.cost_micros,
            )
        await self.settle(outcome, stopped)

    async def _record_agent(self, ctx: RunContext) -> None:
        """What a CLI agent runtime reported: its name and version on the run, its session on the
        task (the first run's session id stays the task's: a resumed session keeps its id)."""
        if not ctx.agent_name:
            return
        await self._set_run(agent_name=ctx.agent_name[:64], agent_version=ctx.agent_version[:64])
        if ctx.agent_session_id and ctx.agent_session_id != self.agent_session_id:
            async with self.env.db.session(write=True) as s:
                await s.execute(
                    update(Task)
                    .where(Task.id == self.task_id)
                    .values(agent_session_id=ctx.agent_session_id[:128])
                    .execution_options(synchronize_session=False)
                )
