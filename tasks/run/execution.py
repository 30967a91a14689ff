"""One run's execution, from claimed to settled: load what the run needs, provision the workspace
and the sandbox (after the policy's `session_start`), run the runtime under the stop request and
the watchdogs (idle, wall clock), then settle (tasks/run/settle.py). Given a `RunEnv`, never the
worker."""

import asyncio
import contextlib
import errno
import time
from pathlib import Path
from typing import Any

import msgspec
import structlog
from sqlalchemy import select, update

from forge.core.text import plural
from forge.db import events
from forge.db.models import Account, Repository
from sandbox import (
    EngineUnavailable,
    ImageMissing,
    Sandbox,
    SandboxError,
    SandboxSpec,
    prepare_workspace,
    weakenings_in_effect,
)
from tasks.core import egress_config, repo_settings
from tasks.core.models import Approval, RepoTaskSettings, Run, Task
from tasks.core.policy import ApprovedCall, GateContext, policy_record
from tasks.core.redaction import Redactor, redact_value
from tasks.core.states import ApprovalState, FailureReason, RunKind, RunState
from tasks.core.transcript import Notice, System
from tasks.core.writer import TranscriptWriter
from tasks.run import gitops, recovery, warm
from tasks.run.backchannel import Backchannel
from tasks.run.egress import RunEgress, proxy_env
from tasks.run.env import RunEnv
from tasks.run.gateway import RunChannel
from tasks.run.outside import Outside, ProvisionFailed
from tasks.run.runtimes.base import ModelEndpoint, Outcome, RunContext, RuntimeLimits, RuntimeUnavailable
from tasks.run.settle import Settling
from tasks.run.supervise import Stopped, Supervising, bypassed

log = structlog.get_logger("forgehand.tasks")


_WATCHDOG_ONLY = (
    "the workspace limit is enforced by a watchdog only (FORGEHAND_TASK_WORKSPACE_QUOTA=watchdog): "
    "a fast writer can pass it before the run is stopped"
)

# session_start's `source` (hooks-protocol.md): a person's decision on an approval resumes the
# task like an answer does.
_SESSION_SOURCE: dict[RunKind, Any] = {
    RunKind.START: "start",
    RunKind.RETRY: "retry",
    RunKind.MESSAGE: "message",
    RunKind.ANSWER: "answer",
    RunKind.REVIEW: "review",
    RunKind.APPROVAL: "answer",
}


BYPASS_NOTIFICATIONS = 10  # `policy.bypassed` notifications of one run at most (the transcript has all)


def _ms(t0: float) -> int:
    return int((time.monotonic() - t0) * 1000)


class Execution(Settling, Supervising, Outside):
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
            self.branch, self.base_sha = task.branch, task.base_sha
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
                "claimed", f"run {self.run_seq} ({self.kind.value}) claimed by worker {self.env.worker_id}"
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
                if self.backchannel.summary is not None:
                    outcome.summary, outcome.summary_reported = self.backchannel.summary, True
            usage = channel.usage
            await self._set_run(
                input_tokens=usage.input_tokens,
                output_tokens=usage.output_tokens,
                cache_read_tokens=usage.cache_read_tokens,
                cache_write_tokens=usage.cache_write_tokens,
                cost_micros=channel.cost_micros,
            )
        await self.settle(outcome, stopped)

    # --- provisioning -------------------------------------------------------------------------

    async def _provision(self) -> RunContext:
        env = self.env
        settings = self.settings
        runtime = env.runtimes.get(self.runtime_name)
        if runtime is None:
            raise ProvisionFailed(FailureReason.INTERNAL, f"unknown runtime {self.runtime_name!r}")
        bind = getattr(runtime, "for_task", None)  # a runtime of configured agents (acp) binds one
        if bind is not None:
            try:
                runtime = bind(self.command, self.env.settings)
            except RuntimeUnavailable as exc:
                raise ProvisionFailed(exc.reason, str(exc)) from exc
        image = await self.image_for(runtime)
        gate_ctx = self.gate_ctx()
        decision = await env.gate.session_start(
            gate_ctx, source=_SESSION_SOURCE.get(self.kind, "answer"), runtime=self.runtime_name, image=image
        )
        record = policy_record(decision)
        if record is not None:
            await self._emit("system", record)
        if decision.user_message:
            await self._emit("notice", Notice(text=decision.user_message))
        if decision.decision != "allow":
            raise ProvisionFailed(FailureReason.POLICY, f"a policy refused the run: {decision.reason or 'denied'}")
        model: ModelEndpoint | None = None
        if runtime.needs_model():
            model = await self._open_channel(runtime)
        if self.egress_plan is not None:
            t0 = time.monotonic()
            egress = await self._open_egress(self.egress_plan)
            plan = self.egress_plan
            await self.system("egress", egress.describe(), t0, rules=list(plan.repo_rules), presets=list(plan.presets))
        # Workspace and sandbox. A warm pool's sandbox (tasks/run/warm.py) comes with the run's
        # workspace filesystem made; otherwise the container starts while the tree is checked out.
        t0 = time.monotonic()
        self.workspace = recovery.workspace_of(env, self.task_uuid, self.run_uuid)
        spec = SandboxSpec(
            image=image, workspace=self.workspace, instance=env.instance, task=self.task_uuid, run=self.run_uuid,
            limits=warm.run_limits(settings), channel_dir=self._channel_dir(),
            env=proxy_env() if self.egress is not None else {}, relays=self._relays(),
        )  # fmt: skip
        pool = env.pools.get(image)
        if pool is not None:
            self.sandbox = await pool.acquire(spec, workspace_limit_bytes=warm.mount_limit(settings))
        pooled = self.sandbox is not None
        head = await self._prepare_workspace()
        if pooled:
            files = await self._check_out(head)
        else:
            checked_out, started = await asyncio.gather(
                self._check_out(head), self._start_sandbox(spec), return_exceptions=True
            )
            for failed in (checked_out, started):
                if isinstance(failed, BaseException):
                    raise failed
            assert isinstance(checked_out, int)
            files = checked_out
        assert self.sandbox is not None
        await self._set_run(start_sha=self.start_sha, container_id=self.sandbox.id)
        limit_mb, quota = settings.task_workspace_limit_mb, settings.task_workspace_quota
        await self.system(
            "workspace",
            f"workspace prepared from {'the task branch' if head else 'the base'} "
            f"at {self.start_sha[:12]} ({plural(files, 'file')}), limit {limit_mb} MiB ({quota})",
            t0,
            sha=self.start_sha,
            files=files,
            limit_mb=limit_mb,
            quota=quota,
        )
        if quota == "watchdog":
            await self._emit("notice", Notice(text=f"{_WATCHDOG_ONLY} ({limit_mb} MiB)", level="warning"))
        weakened = weakenings_in_effect(spec)
        await self.system(
            "sandbox",
            f"sandbox {self.sandbox.name} {'taken from the warm pool' if pooled else 'started'}",
            t0,
            container=self.sandbox.name,
            weakened=weakened,
            pooled=pooled,
        )
        self._check_stop()
        t0 = time.monotonic()
        if decision.model_context and runtime.needs_model():
            self.conversation.append({"role": "system", "content": decision.model_context})
        ctx = RunContext(
            sandbox=self.sandbox,
            kind=self.kind,
            goal=self.goal,
            prompt=self.prompt,
            command=self.command,
            conversation=self.conversation,
            limits=RuntimeLimits(
                turn_limit=settings.task_turn_limit,
                tool_timeout=settings.task_tool_timeout_seconds,
                token_budget=settings.task_token_budget,
            ),
            gate=env.gate,
            gate_ctx=gate_ctx,
            emit=self._emit,
            emit_many=self._emit_many,
            model=model,
            channel=self.channel,
            backchannel=self.backchannel,
            approval=self.approved,
            agent_session_id=self.agent_session_id,
            state_dir=self.settings.data_dir.resolve() / "agents" / self.task_uuid,
        )
        self.runtime = runtime
        await self.system("runtime", f"runtime {runtime.name} started", t0, runtime=runtime.name)
        return ctx

    async def _prepare_workspace(self) -> str | None:
        """The run's workspace directory (its own filesystem with the quota; made already when the
        sandbox came from the pool); returns the task branch's head (None: start from the base)."""
        assert self.workspace is not None
        try:
            head = await self.env.store.read(self.repo_key, gitops.branch_sha, self.branch)
            await asyncio.to_thread(prepare_workspace, self.workspace, limit_bytes=warm.mount_limit(self.settings))
        except Exception as exc:
            raise self._workspace_failed(exc) from exc
        return head

    async def _check_out(self, head: str | None) -> int:
        """Check the tree out into the workspace; the number of files."""
        assert self.workspace is not None
        try:
            self.checkout = await self.env.store.read(
                self.repo_key, gitops.checkout_tree, head or self.base_sha, self.workspace
            )
            await asyncio.to_thread(gitops.save_manifest, self.workspace, self.checkout)
        except Exception as exc:
            raise self._workspace_failed(exc) from exc
        self.start_sha = head or self.base_sha  # only now: a partial checkout is never snapshotted
        return self.checkout.files

    def _workspace_failed(self, exc: Exception) -> ProvisionFailed:
        log.exception("workspace preparation failed", run_id=self.run_id)
        if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
            limit_mb = self.settings.task_workspace_limit_mb
            return ProvisionFailed(
                FailureReason.DISK_LIMIT, f"the checkout does not fit the workspace limit of {limit_mb} MiB"
            )
        return ProvisionFailed(FailureReason.WORKSPACE, f"the workspace could not be prepared: {exc}")

    async def _start_sandbox(self, spec: SandboxSpec) -> None:
        try:
            self.sandbox = await self.env.engine.start(spec)
        except ImageMissing as exc:
            raise ProvisionFailed(
                FailureReason.IMAGE_MISSING,
                f"the sandbox image {self.env.image} is missing: run `forgehand sandbox build`",
            ) from exc
        except EngineUnavailable as exc:
            raise ProvisionFailed(FailureReason.ENGINE_UNAVAILABLE, f"no Docker engine answered: {exc}") from exc
        except SandboxError as exc:
            raise ProvisionFailed(FailureReason.ENGINE_UNAVAILABLE, f"the sandbox could not start: {exc}") from exc

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

    def _check_stop(self) -> None:
        if self.stop_event.is_set():
            raise Stopped(None, "stopped by request")
