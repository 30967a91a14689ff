"""Provisioning a run, a step of `Execution` (tasks/run/execution.py): the runtime bound, the
policy's `session_start`, the channels out of the sandbox (tasks/run/outside.py), the workspace
checked out and the sandbox started (or taken from a warm pool) side by side, and the
`RunContext` the runtime is given."""

import asyncio
import errno
import time
from pathlib import Path
from typing import Any

import structlog

from forge.core.text import plural
from forge.git import fences
from sandbox import (
    EngineUnavailable,
    ImageMissing,
    Sandbox,
    SandboxError,
    SandboxSpec,
    prepare_workspace,
    weakenings_in_effect,
)
from tasks.core.custom_tools import catalog
from tasks.core.egress_config import EgressPlan
from tasks.core.models import Task
from tasks.core.policy import ApprovedCall, GateContext, GateDecision, policy_record
from tasks.core.states import FailureReason, RunKind
from tasks.core.transcript import Notice
from tasks.run import gitops, recovery, warm
from tasks.run.backchannel.custom import CustomTools, Placement
from tasks.run.backchannel.proposals import starter_is_admin
from tasks.run.egress import blocked_notifier, proxy_env
from tasks.run.environment import EnvironmentStep, repo_secrets_of
from tasks.run.outside import Outside, ProvisionFailed
from tasks.run.runtimes.base import ModelEndpoint, RunContext, Runtime, RuntimeLimits, RuntimeUnavailable
from tasks.run.supervise import Stopped
from tasks.run.tool_exec import ToolEgress

log = structlog.get_logger("forgehand.tasks")

_WATCHDOG_ONLY = (
    "the workspace limit is enforced by a watchdog only (FORGEHAND_TASK_WORKSPACE_QUOTA=watchdog): "
    "a fast writer can pass it before the run is stopped"
)

# session_start's `source` (docs/webhooks.md): a person's decision on an approval resumes the
# task like an answer does.
_SESSION_SOURCE: dict[RunKind, Any] = {
    RunKind.START: "start",
    RunKind.RETRY: "retry",
    RunKind.MESSAGE: "message",
    RunKind.ANSWER: "answer",
    RunKind.REVIEW: "review",
    RunKind.APPROVAL: "answer",
}


class Provisioning(Outside):
    """The provisioning steps of `Execution` (what it loaded and holds, declared here)."""

    stop_event: asyncio.Event
    kind: RunKind
    runtime_name: str
    command: Any
    goal: str
    prompt: str
    conversation: list[dict[str, Any]]
    approved: ApprovedCall | None
    agent_session_id: str
    task_uuid: str
    branch: str
    base_sha: str
    repo_key: tuple[str, str]
    repo_uuid: str
    default_branch: str
    environment_generation: int
    environment_yml: str | None
    environment_override: dict[str, Any] | None
    registered_images: tuple[str, ...]
    egress_plan: EgressPlan | None
    sandbox: Sandbox | None
    workspace: Path | None
    checkout: gitops.Checkout | None
    start_sha: str
    runtime: Runtime
    run_uuid: str
    fence_held: bool

    async def system(self, phase: str, text: str, t0: float | None = None, **detail: Any) -> None:
        raise NotImplementedError

    def gate_ctx(self) -> GateContext:
        raise NotImplementedError

    async def _provision(self) -> RunContext:
        runtime = self._bind_runtime()
        image = await self.image_for(runtime)
        gate_ctx = self.gate_ctx()
        decision = await self._session_start(gate_ctx, image)
        model: ModelEndpoint | None = None
        if runtime.needs_model():
            model = await self._open_channel(runtime)
        if self.egress_plan is not None:
            t0 = time.monotonic()
            egress = await self._open_egress(self.egress_plan)
            plan = self.egress_plan
            await self.system("egress", egress.describe(), t0, rules=list(plan.repo_rules), presets=list(plan.presets))
        plain = image
        image = await self._environment(image)
        await self._place(image)
        if self.backchannel is not None:
            await self._offer_tools(self.env.image if image == plain else image)
        self._check_stop()
        t0 = time.monotonic()
        if decision.model_context and runtime.needs_model():
            self.conversation.append({"role": "system", "content": decision.model_context})
        ctx = self._context(gate_ctx, model)
        self.runtime = runtime
        await self.system("runtime", f"runtime {runtime.name} started", t0, runtime=runtime.name)
        return ctx

    async def _offer_tools(self, image: str) -> None:
        """The repository's custom tools, offered on the back-channel (docs/tools.md). A call runs
        in a container of its own: the environment's image when the repository has one (the plain
        sandbox image rather than the agents image otherwise), this run's workspace, its egress."""
        assert self.backchannel is not None and self.workspace is not None and self.writer is not None
        self.backchannel.may_propose = await starter_is_admin(self.env.db, self.task_id)
        async with self.env.db.session() as s:
            tools = await catalog(s, self.repo_id)
            agent_id = (await s.get(Task, self.task_id)).agent_id  # type: ignore[union-attr]
        if not tools:
            return
        egress = None
        if self.egress_plan is not None:
            notify = blocked_notifier(self.env, self.task_id, self.repo_id, self.run_id)
            egress = ToolEgress(plan=self.egress_plan, emit=self._emit, notify=notify)
        placement = Placement(
            engine=self.env.engine, image=image, workspace=self.workspace, instance=self.env.instance,
            task_label=self.task_uuid, run_label=self.run_uuid,
            channel_root=self.settings.effective_run_channel_dir, egress=egress, labels=warm.worker_labels(self.env),
        )  # fmt: skip
        self.backchannel.custom = CustomTools(
            db=self.env.db, lifecycle=self.env.lifecycle, hub=self.env.hub, tools=tools, task_id=self.task_id,
            run_id=self.run_id, repo_id=self.repo_id, agent_id=agent_id, placement=placement, emit=self._emit,
            redact=self.writer.redactor.redact, approval_ttl_seconds=self.settings.task_approval_ttl_seconds,
        )  # fmt: skip
        names = ", ".join(t.agent_name for t in tools)
        await self.system("tools", f"custom tools offered: {names}", tools=[t.agent_name for t in tools])

    async def _environment(self, image: str) -> str:
        """The repository's environment image when it declares one (tasks/run/environment.py)."""
        step = EnvironmentStep(
            env=self.env, repo_key=self.repo_key, repo_uuid=self.repo_uuid, default_branch=self.default_branch,
            run_uuid=self.run_uuid, generation=self.environment_generation, in_settings=self.environment_yml,
            override=self.environment_override, registered_images=self.registered_images,
            system=self.system,
            secrets=self._setup_secrets,
            emit=self._emit,
            notify_blocked=blocked_notifier(self.env, self.task_id, self.repo_id, self.run_id, phase="environment"),
        )  # fmt: skip
        return await step.image(image)

    async def _setup_secrets(self, names: tuple[str, ...]) -> dict[str, str]:
        if not names:
            return {}
        async with self.env.db.session() as s:
            return await repo_secrets_of(s, self.env.settings, self.repo_id, names)

    def _bind_runtime(self) -> Runtime:
        """The task's runtime; a runtime of configured agents (acp) binds the task's agent."""
        runtime = self.env.runtimes.get(self.runtime_name)
        if runtime is None:
            raise ProvisionFailed(FailureReason.INTERNAL, f"unknown runtime {self.runtime_name!r}")
        bind = getattr(runtime, "for_task", None)  # a runtime of configured agents (acp) binds one
        if bind is not None:
            try:
                runtime = bind(self.command, self.env.settings)
            except RuntimeUnavailable as exc:
                raise ProvisionFailed(exc.reason, str(exc)) from exc
        return runtime

    async def _session_start(self, gate_ctx: GateContext, image: str) -> GateDecision:
        """The policy's `session_start`, its record and message on the transcript; a refusal fails the run."""
        decision = await self.env.gate.session_start(
            gate_ctx, source=_SESSION_SOURCE.get(self.kind, "answer"), runtime=self.runtime_name, image=image
        )
        record = policy_record(decision)
        if record is not None:
            await self._emit("system", record)
        if decision.user_message:
            await self._emit("notice", Notice(text=decision.user_message))
        if decision.decision != "allow":
            raise ProvisionFailed(FailureReason.POLICY, f"a policy refused the run: {decision.reason or 'denied'}")
        return decision

    async def _place(self, image: str) -> None:
        """Workspace and sandbox. A warm pool's sandbox (tasks/run/warm.py) comes with the run's
        workspace filesystem made; otherwise the container starts while the tree is checked out."""
        env, settings = self.env, self.settings
        t0 = time.monotonic()
        self.workspace = recovery.workspace_of(env, self.task_uuid, self.run_uuid)
        spec = SandboxSpec(
            image=image, workspace=self.workspace, instance=env.instance, task=self.task_uuid, run=self.run_uuid,
            limits=warm.run_limits(settings), channel_dir=self._channel_dir(),
            env=proxy_env() if self.egress is not None else {}, relays=self._relays(),
            extra_labels=warm.worker_labels(env), hosts_file=warm.hosts_file(settings),
        )  # fmt: skip
        pool = env.pools.get(image)
        if pool is not None:
            self.sandbox = await pool.acquire(spec, workspace_limit_bytes=warm.mount_limit(settings))
        pooled = self.sandbox is not None
        head = await self._prepare_workspace()
        if pooled:
            files = await self._check_out(head)
        else:
            files = await self._check_out_and_start(head, spec)
        assert self.sandbox is not None
        await self._set_run(start_sha=self.start_sha, container_id=self.sandbox.id)
        await self._report_placed(t0, head, files, spec, pooled)

    async def _check_out_and_start(self, head: str | None, spec: SandboxSpec) -> int:
        """The tree checked out while the sandbox starts; the number of files."""
        checked_out, started = await asyncio.gather(
            self._check_out(head), self._start_sandbox(spec), return_exceptions=True
        )
        for failed in (checked_out, started):
            if isinstance(failed, BaseException):
                raise failed
        assert isinstance(checked_out, int)
        return checked_out

    async def _report_placed(self, t0: float, head: str | None, files: int, spec: SandboxSpec, pooled: bool) -> None:
        """The workspace's and the sandbox's system events (and the watchdog-only quota's warning)."""
        assert self.sandbox is not None
        limit_mb, quota = self.settings.task_workspace_limit_mb, self.settings.task_workspace_quota
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

    def _context(self, gate_ctx: GateContext, model: ModelEndpoint | None) -> RunContext:
        """What the runtime is given."""
        assert self.sandbox is not None
        settings = self.settings
        return RunContext(
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
            gate=self.env.gate,
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

    async def _prepare_workspace(self) -> str | None:
        """The run's workspace directory (its own filesystem with the quota; made already when the
        sandbox came from the pool); returns the task branch's head (None: start from the base)."""
        assert self.workspace is not None
        try:
            # The run's git fence before anything of it reaches git (forge.git.fences): refused if
            # the run was taken over already.
            await self.env.store.write(self.repo_key, fences.hold, self.run_uuid)
            self.fence_held = True
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

    def _check_stop(self) -> None:
        if self.stop_event.is_set():
            raise Stopped(None, "stopped by request")
