"""The worker: claims queued runs, provisions a workspace and a sandbox, runs the runtime, takes the
snapshot commit and settles the task. In-process (the app's lifespan) or `forgehand worker`.

Concurrency: at most `task_concurrency` runs per worker and `task_repo_concurrency` running runs per
repository. Each owned run carries the worker's id and a heartbeat; at start-up (and periodically)
runs whose owner is gone are failed as `interrupted` and their containers reaped."""

import asyncio
import contextlib
import os
import secrets
import shutil
import socket
import time
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import structlog
from sqlalchemy import func, select, update

from forge.db import Database, utcnow
from forge.events import EventBus
from forge.git import Identity, RepoStore
from forge.models import Account, Repository
from forge.settings import Settings
from sandbox import (
    DEFAULT_IMAGE,
    EngineUnavailable,
    ImageMissing,
    Limits,
    Sandbox,
    SandboxEngine,
    SandboxError,
    SandboxSpec,
    prepare_workspace,
    reap,
    weakenings_in_effect,
)
from tasks import approvals, gitops, repo_settings, transcript
from tasks.live import LiveHub
from tasks.models import Approval, Run, Task
from tasks.policy import GateContext, PolicyGate, policy_record
from tasks.runtime import ApprovedCall, ModelEndpoint, Outcome, RunContext, Runtime, RuntimeLimits, RuntimeUnavailable
from tasks.service import publish, set_state
from tasks.states import FailureReason, RunKind, RunState, TaskState
from tasks.transcript import Notice, Pending, Prompt, Redactor, Summary, System
from tasks.writer import TranscriptWriter

log = structlog.get_logger("forgehand.tasks")

HEARTBEAT_SECONDS = 1.0
STALE_SECONDS = 60.0
RECOVER_EVERY = 30.0
APPROVAL_SWEEP_SECONDS = 2.0

# Worker ids alive in this process: a run owned by an id of this process that is not here is orphaned.
_LIVE_WORKERS: set[str] = set()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def owner_gone(owner: str, heartbeat_at: Any, *, now: Any = None) -> bool:
    host, _, rest = owner.partition(":")
    pid_text, _, _nonce = rest.partition(":")
    if host == socket.gethostname() and pid_text.isdigit():
        pid = int(pid_text)
        if pid == os.getpid():
            return owner not in _LIVE_WORKERS
        return not _pid_alive(pid)
    now = now or utcnow()
    return heartbeat_at is None or now - heartbeat_at > timedelta(seconds=STALE_SECONDS)


def default_runtimes() -> dict[str, Runtime]:
    from tasks.builtin_runtime import BuiltinRuntime
    from tasks.command_runtime import CommandRuntime

    return {"command": CommandRuntime(), "builtin": BuiltinRuntime()}


class Stopped(Exception):
    """The run was asked to stop (or a watchdog stopped it)."""

    def __init__(self, reason: FailureReason | None, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class TaskWorker:
    def __init__(
        self,
        db: Database,
        settings: Settings,
        store: RepoStore,
        bus: EventBus,
        hub: LiveHub,
        gate: PolicyGate,
        *,
        engine: SandboxEngine | None = None,
        runtimes: dict[str, Runtime] | None = None,
        extra_secrets: tuple[str, ...] = (),
    ) -> None:
        self.db = db
        self.settings = settings
        self.store = store
        self.bus = bus
        self.hub = hub
        self.gate = gate
        self.engine = engine or SandboxEngine()
        self._own_engine = engine is None
        self.runtimes = runtimes or default_runtimes()
        self.extra_secrets = extra_secrets
        self.id = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self.instance = settings.instance_id or "forgehand"
        self.image = settings.sandbox_image or DEFAULT_IMAGE
        self._running: dict[int, asyncio.Task[None]] = {}
        self._task_of_run: dict[int, int] = {}
        self._stop_events: dict[int, asyncio.Event] = {}
        self._wake = asyncio.Event()
        self._check_stops = asyncio.Event()
        self._bg: list[asyncio.Task[None]] = []
        self._closing = False

    # --- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        _LIVE_WORKERS.add(self.id)
        await self.recover(reap_containers=True)
        self.hub.listen(self._on_notify)
        self._bg = [
            asyncio.create_task(self._claim_loop()),
            asyncio.create_task(self._heartbeat_loop()),
            asyncio.create_task(self._expire_loop()),
        ]
        log.info("task worker started", worker=self.id)

    async def close(self) -> None:
        """Stop claiming; runs still going end as `interrupted` (with their WIP snapshot)."""
        self._closing = True
        self.hub.unlisten(self._on_notify)
        for bg in self._bg:
            bg.cancel()
        for bg in self._bg:
            with contextlib.suppress(asyncio.CancelledError):
                await bg
        for run_task in list(self._running.values()):
            run_task.cancel()
        if self._running:
            await asyncio.wait(list(self._running.values()), timeout=60)
        _LIVE_WORKERS.discard(self.id)
        if self._own_engine:
            await self.engine.close()

    def wake(self) -> None:
        self._wake.set()

    def _on_notify(self, task_id: int) -> None:
        # Called from any thread: a stop request, a new run. Look soon, on our own loop.
        self._wake.set()
        self._check_stops.set()

    async def run_forever(self) -> None:
        await self.start()
        try:
            await asyncio.Event().wait()
        finally:
            await self.close()

    async def idle(self, timeout: float = 60.0) -> None:  # noqa: ASYNC109
        """Wait until nothing is queued or running here (tests, the bench)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            async with self.db.session() as s:
                busy = (
                    await s.execute(
                        select(func.count(Run.id)).where(Run.state.in_([RunState.QUEUED, RunState.RUNNING]))
                    )
                ).scalar_one()
            if not busy and not self._running:
                return
            await asyncio.sleep(0.1)
        raise TimeoutError("runs still active")

    # --- recovery -----------------------------------------------------------------------------

    async def recover(self, *, reap_containers: bool) -> None:
        keep: set[str] = set()
        async with self.db.session(write=True) as s:
            runs = (await s.execute(select(Run).where(Run.state == RunState.RUNNING))).scalars().all()
            for run in runs:
                if run.owner == self.id or not owner_gone(run.owner, run.heartbeat_at):
                    keep.add(run.uuid)
                    continue
                await self._settle_interrupted(s, run)
        if reap_containers:
            try:
                removed = await reap(self.engine, self.instance, keep=keep)
            except (EngineUnavailable, SandboxError) as exc:
                log.warning("could not reap sandboxes", error=str(exc))
            else:
                if removed:
                    log.info("reaped orphaned sandboxes", count=len(removed))

    async def _settle_interrupted(self, s: Any, run: Run) -> None:
        task = await s.get(Task, run.task_id)
        repo = await s.get(Repository, run.repo_id)
        run.state = RunState.FAILED
        run.failure_reason = FailureReason.INTERRUPTED
        run.error = "interrupted: the worker running it went away"
        run.finished_at = utcnow()
        if task is None or repo is None:
            return
        await transcript.append(
            s,
            task.id,
            [Pending(kind="notice", payload=Notice(text=run.error, level="error"), run_id=run.id)],
        )
        base_url = self.settings.effective_base_url
        await publish(s, self.bus, "run.finished", task, repo, base_url=base_url, run=run, data=_run_data(run))
        if TaskState(task.state) in (TaskState.RUNNING, TaskState.QUEUED):
            task.failure_reason = FailureReason.INTERRUPTED
            task.error = run.error
            await set_state(s, self.bus, task, repo, TaskState.FAILED, base_url=base_url, run=run)
        self.hub.notify(task.id)

    # --- claiming -----------------------------------------------------------------------------

    async def _claim_loop(self) -> None:
        last_recover = time.monotonic()
        while not self._closing:
            try:
                free = self.settings.task_concurrency - len(self._running)
                if free > 0:
                    for run_id, task_id in await self._claim(free):
                        self._spawn(run_id, task_id)
                if time.monotonic() - last_recover > RECOVER_EVERY:
                    last_recover = time.monotonic()
                    await self.recover(reap_containers=True)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("claiming runs failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), 1.0)
            self._wake.clear()

    async def _claim(self, free: int) -> list[tuple[int, int]]:
        claimed: list[tuple[int, int]] = []
        async with self.db.session(write=True) as s:
            busy: dict[int, int] = dict(
                (
                    await s.execute(
                        select(Run.repo_id, func.count(Run.id))
                        .where(Run.state == RunState.RUNNING)
                        .group_by(Run.repo_id)
                    )
                )
                .tuples()
                .all()
            )
            stmt = select(Run).where(Run.state == RunState.QUEUED).order_by(Run.id).limit(100)
            if s.get_bind().dialect.name == "postgresql":
                stmt = stmt.with_for_update(skip_locked=True)
            for run in (await s.execute(stmt)).scalars().all():
                if len(claimed) >= free:
                    break
                if busy.get(run.repo_id, 0) >= self.settings.task_repo_concurrency:
                    continue
                task = await s.get(Task, run.task_id)
                repo = await s.get(Repository, run.repo_id)
                if task is None or repo is None or task.state != TaskState.QUEUED:
                    run.state = RunState.CANCELLED
                    run.finished_at = utcnow()
                    continue
                busy[run.repo_id] = busy.get(run.repo_id, 0) + 1
                run.state = RunState.RUNNING
                run.owner = self.id
                run.heartbeat_at = utcnow()
                run.started_at = utcnow()
                base_url = self.settings.effective_base_url
                await set_state(s, self.bus, task, repo, TaskState.RUNNING, base_url=base_url, run=run)
                await publish(
                    s, self.bus, "run.started", task, repo, base_url=base_url, run=run, data={"kind": run.kind}
                )
                claimed.append((run.id, task.id))
        for _, task_id in claimed:
            self.hub.notify(task_id)
        return claimed

    def _spawn(self, run_id: int, task_id: int) -> None:
        self._stop_events[run_id] = asyncio.Event()
        self._task_of_run[run_id] = task_id

        async def go() -> None:
            try:
                await Execution(self, run_id, self._stop_events[run_id]).run()
            except asyncio.CancelledError:
                pass
            except Exception:
                log.exception("run crashed", run_id=run_id)
            finally:
                self._running.pop(run_id, None)
                self._stop_events.pop(run_id, None)
                self._task_of_run.pop(run_id, None)
                self._wake.set()

        self._running[run_id] = asyncio.create_task(go(), name=f"forgehand-run-{run_id}")

    async def _expire_loop(self) -> None:
        """Parked tool calls nobody decided in time expire (their tasks fail, a retry goes on)."""
        while not self._closing:
            try:
                for task_id in await approvals.expire_due(self.db, self.bus, self.settings.effective_base_url):
                    self.hub.notify(task_id)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("expiring approvals failed")
            await asyncio.sleep(APPROVAL_SWEEP_SECONDS)

    async def _heartbeat_loop(self) -> None:
        while not self._closing:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._check_stops.wait(), HEARTBEAT_SECONDS)
            self._check_stops.clear()
            owned = list(self._running)
            if not owned:
                continue
            try:
                async with self.db.session(write=True) as s:
                    await s.execute(
                        update(Run)
                        .where(Run.id.in_(owned), Run.owner == self.id)
                        .values(heartbeat_at=utcnow())
                        .execution_options(synchronize_session=False)
                    )
                    stopping = (
                        (await s.execute(select(Run.id).where(Run.id.in_(owned), Run.stop_requested.is_(True))))
                        .scalars()
                        .all()
                    )
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("heartbeat failed")
                continue
            for run_id in stopping:
                event = self._stop_events.get(run_id)
                if event is not None:
                    event.set()


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


def _run_data(run: Run) -> dict[str, Any]:
    return {
        "kind": run.kind,
        "state": run.state,
        "exit_code": run.exit_code,
        "failure_reason": run.failure_reason or None,
        "error": run.error,
        "end_sha": run.end_sha,
    }


def _remove_workspace(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
    with contextlib.suppress(OSError):
        path.parent.rmdir()  # the task's directory, when this was its last workspace


def _ms(t0: float) -> int:
    return int((time.monotonic() - t0) * 1000)


class Execution:
    """One run, from claimed to settled."""

    def __init__(self, worker: TaskWorker, run_id: int, stop: asyncio.Event) -> None:
        self.w = worker
        self.settings = worker.settings  # until the repository's overrides are loaded
        self.run_id = run_id
        self.stop_event = stop
        self.sandbox: Sandbox | None = None
        self.workspace: Path | None = None
        self.checkout: gitops.Checkout | None = None
        self.start_sha = ""
        self.writer: TranscriptWriter | None = None

    async def _load(self) -> None:
        async with self.w.db.session() as s:
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
            self.branch, self.base_sha = task.branch, task.base_sha
            self.conversation = list(task.conversation or [])
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
                        approved=decided.state == "approved",
                        decided_by=decider.login if decider else "",
                        reason=decided.decision_reason,
                    )
            self.repo_key = (repo.owner.login.lower(), repo.name.lower())
            self.full_name = f"{repo.owner.login}/{repo.name}"
            self.repo_uuid = repo.uuid
            # The instance's settings with this repository's overrides (model endpoint, limits).
            self.settings = await repo_settings.effective(s, self.w.settings, repo.id)
            self.agent_login = agent.login if agent else "agent"
            self.starter_login = starter.login if starter else ""
            self.starter_type = "Bot" if starter is not None and starter.is_bot else "User"

    def _gate_ctx(self) -> GateContext:
        base = self.w.settings.effective_base_url
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
        )

    async def system(self, phase: str, text: str, t0: float | None = None, **detail: Any) -> None:
        assert self.writer is not None
        await self.writer.emit(
            "system", System(phase=phase, text=text, duration_ms=_ms(t0) if t0 is not None else None, detail=detail)
        )

    async def run(self) -> None:
        await self._load()
        settings = self.settings
        redactor = Redactor([settings.model_api_key, settings.secret_key, *self.w.extra_secrets])
        self.writer = TranscriptWriter(self.w.db, self.w.hub, self.task_id, self.run_id, redactor)
        self.writer.start()
        outcome: Outcome
        stopped = False
        cancelled = False
        ctx: RunContext | None = None
        try:
            await self.system("claimed", f"run {self.run_seq} ({self.kind.value}) claimed by worker {self.w.id}")
            ctx = await self._provision()
            outcome = await self._supervise(ctx)
        except Stopped as exc:
            stopped = exc.reason is None
            outcome = Outcome(status="failed", failure_reason=exc.reason, error=str(exc))
        except _ProvisionFailed as exc:
            outcome = Outcome(status="failed", failure_reason=exc.reason, error=str(exc))
        except asyncio.CancelledError:
            cancelled = True
            outcome = Outcome(
                status="failed", failure_reason=FailureReason.INTERRUPTED, error="interrupted: the worker shut down"
            )
        except Exception as exc:
            log.exception("run failed unexpectedly", run_id=self.run_id)
            outcome = Outcome(
                status="failed", failure_reason=FailureReason.INTERNAL, error=f"internal error: {type(exc).__name__}"
            )
        if ctx is not None:
            self.turns, self.prompt_tokens, self.completion_tokens = ctx.turns, ctx.prompt_tokens, ctx.completion_tokens
        # Settle even when cancelled: shield the cleanup so a shutdown cannot leave a container behind.
        settle = asyncio.ensure_future(self._settle(outcome, stopped))
        try:
            await asyncio.shield(settle)
        except asyncio.CancelledError:
            cancelled = True
            await settle
        if cancelled:
            raise asyncio.CancelledError

    # --- provisioning -------------------------------------------------------------------------

    async def _provision(self) -> RunContext:
        w = self.w
        settings = self.settings
        runtime = w.runtimes.get(self.runtime_name)
        if runtime is None:
            raise _ProvisionFailed(FailureReason.INTERNAL, f"unknown runtime {self.runtime_name!r}")
        gate_ctx = self._gate_ctx()
        decision = await w.gate.session_start(
            gate_ctx, source=_SESSION_SOURCE.get(self.kind, "answer"), runtime=self.runtime_name, image=w.image
        )
        record = policy_record(decision)
        if record is not None:
            await self._emit("system", record)
        if decision.user_message:
            await self._emit("notice", Notice(text=decision.user_message))
        if decision.decision != "allow":
            raise _ProvisionFailed(FailureReason.POLICY, f"a policy refused the run: {decision.reason or 'denied'}")
        model: ModelEndpoint | None = None
        if runtime.needs_model():
            if not (settings.model_base_url and settings.model_name):
                raise _ProvisionFailed(FailureReason.MODEL_UNREACHABLE, "no model endpoint is configured")
            model = ModelEndpoint(
                base_url=settings.model_base_url,
                model=settings.model_name,
                api_key=settings.model_api_key,
                timeout=settings.model_timeout_seconds,
            )
        # Workspace: the task branch if it exists, else the base, at a recorded sha.
        t0 = time.monotonic()
        try:
            head = await w.store.read(self.repo_key, gitops.branch_sha, self.branch)
            self.start_sha = head or self.base_sha
            self.workspace = prepare_workspace(
                settings.data_dir.resolve() / "workspaces" / self.task_uuid / self.run_uuid
            )
            self.checkout = await w.store.read(self.repo_key, gitops.checkout_tree, self.start_sha, self.workspace)
            files = self.checkout.files
        except Exception as exc:
            log.exception("workspace preparation failed", run_id=self.run_id)
            raise _ProvisionFailed(FailureReason.WORKSPACE, f"the workspace could not be prepared: {exc}") from exc
        await self._set_run(start_sha=self.start_sha)
        await self.system(
            "workspace",
            f"workspace prepared from {'the task branch' if head else 'the base'} "
            f"at {self.start_sha[:12]} ({files} files)",
            t0,
            sha=self.start_sha,
            files=files,
        )
        self._check_stop()
        # Sandbox.
        t0 = time.monotonic()
        spec = SandboxSpec(
            image=w.image,
            workspace=self.workspace,
            instance=w.instance,
            task=self.task_uuid,
            run=self.run_uuid,
            limits=Limits(
                wall_clock_seconds=settings.task_wall_clock_seconds,
                exec_timeout_seconds=settings.task_tool_timeout_seconds,
            ),
        )
        try:
            self.sandbox = await w.engine.start(spec)
        except ImageMissing as exc:
            raise _ProvisionFailed(
                FailureReason.IMAGE_MISSING, f"the sandbox image {w.image} is missing: run `forgehand sandbox build`"
            ) from exc
        except EngineUnavailable as exc:
            raise _ProvisionFailed(FailureReason.ENGINE_UNAVAILABLE, f"no Docker engine answered: {exc}") from exc
        except SandboxError as exc:
            raise _ProvisionFailed(FailureReason.ENGINE_UNAVAILABLE, f"the sandbox could not start: {exc}") from exc
        await self._set_run(container_id=self.sandbox.id)
        weakened = weakenings_in_effect(spec)
        await self.system(
            "sandbox", f"sandbox {self.sandbox.name} started", t0, container=self.sandbox.name, weakened=weakened
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
            gate=w.gate,
            gate_ctx=gate_ctx,
            emit=self._emit,
            model=model,
            approval=self.approved,
        )
        self.runtime = runtime
        await self.system("runtime", f"runtime {runtime.name} started", t0, runtime=runtime.name)
        return ctx

    async def _emit(self, kind: Any, payload: Any) -> None:
        assert self.writer is not None
        await self.writer.emit(kind, payload)

    def _check_stop(self) -> None:
        if self.stop_event.is_set():
            raise Stopped(None, "stopped by request")

    async def _set_run(self, **values: Any) -> None:
        async with self.w.db.session(write=True) as s:
            await s.execute(
                update(Run).where(Run.id == self.run_id).values(**values).execution_options(synchronize_session=False)
            )

    async def _supervise(self, ctx: RunContext) -> Outcome:
        """Run the runtime under the stop request and the watchdogs (idle, wall clock)."""
        settings = self.settings
        assert self.writer is not None
        runtime_task = asyncio.ensure_future(self.runtime.run(ctx))
        stop_wait = asyncio.ensure_future(self.stop_event.wait())
        deadline = time.monotonic() + settings.task_wall_clock_seconds
        idle = settings.task_idle_seconds
        warned = False
        try:
            while True:
                done, _ = await asyncio.wait(
                    {runtime_task, stop_wait}, timeout=0.5, return_when=asyncio.FIRST_COMPLETED
                )
                if runtime_task in done:
                    try:
                        return runtime_task.result()
                    except RuntimeUnavailable as exc:
                        return Outcome(status="failed", failure_reason=exc.reason, error=str(exc))
                if stop_wait in done:
                    raise Stopped(None, "stopped by request")
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
                    warned = True
                    await self.writer.emit(
                        "notice",
                        Notice(text=f"no activity for {quiet:.0f} s; the run stops at {idle:g} s", level="warning"),
                        activity=False,
                    )
                elif quiet < idle * 2 / 3:
                    warned = False
        finally:
            stop_wait.cancel()
            if not runtime_task.done():
                # Removing the sandbox ends any exec at once; then the runtime task unwinds.
                if self.sandbox is not None:
                    with contextlib.suppress(Exception):
                        await self.sandbox.remove()
                runtime_task.cancel()
                with contextlib.suppress(BaseException):
                    await asyncio.wait_for(runtime_task, 30)

    # --- settling -----------------------------------------------------------------------------

    async def _settle(self, outcome: Outcome, stopped: bool) -> None:
        w = self.w
        assert self.writer is not None
        if self.sandbox is not None:
            t0 = time.monotonic()
            try:
                await self.sandbox.remove()
                await self.system("sandbox_removed", "sandbox removed", t0)
            except Exception as exc:
                log.warning("sandbox removal failed", run_id=self.run_id, error=str(exc))
        run_state = (
            RunState.STOPPED
            if stopped
            else {"succeeded": RunState.SUCCEEDED, "failed": RunState.FAILED, "blocked": RunState.BLOCKED}[
                outcome.status
            ]
        )
        snap: gitops.Snapshot | None = None
        if self.workspace is not None and self.start_sha:
            t0 = time.monotonic()
            wip = run_state in (RunState.FAILED, RunState.STOPPED)
            try:
                snap = await w.store.write(
                    self.repo_key,
                    gitops.snapshot_commit,
                    self.workspace,
                    branch=self.branch,
                    parent_sha=self.start_sha,
                    message=self._message(outcome, run_state, wip),
                    author=self._agent_identity(),
                    committer=Identity(name="forgehand", email=f"forgehand@{self._host()}"),
                    limits=gitops.SnapshotLimits(max_file_bytes=w.settings.task_max_file_bytes),
                    manifest=self.checkout,
                )
            except Exception as exc:
                log.exception("snapshot failed", run_id=self.run_id)
                await self.writer.emit("notice", Notice(text=f"the snapshot commit failed: {exc}", level="error"))
                if not stopped:  # a run whose work could not be committed fails: never "success, nothing to review"
                    big = isinstance(exc, gitops.SnapshotTooLarge)
                    outcome.failure_reason = FailureReason.SNAPSHOT_TOO_LARGE if big else FailureReason.SNAPSHOT_FAILED
                    outcome.status, outcome.error, run_state = "failed", f"the snapshot failed: {exc}", RunState.FAILED
            else:
                if snap.committed:
                    kind = "work-in-progress snapshot" if wip else "snapshot"
                    text = f"{kind} {snap.sha[:12]} on {self.branch}: {len(snap.changed_files)} files changed"
                else:
                    text = "no changes: no new commit"
                await self.system(
                    "snapshot",
                    text,
                    t0,
                    sha=snap.sha,
                    committed=snap.committed,
                    wip=wip and snap.committed,
                    changed_files=snap.changed_files[:200],
                    skipped=[{"path": s.path, "reason": s.reason} for s in snap.skipped[:200]],
                )
                if snap.skipped:
                    await self.writer.emit(
                        "notice",
                        Notice(
                            text="not committed: " + "; ".join(f"{s.path} ({s.reason})" for s in snap.skipped[:20]),
                            level="warning",
                        ),
                    )
            if outcome.status == "succeeded" or stopped or outcome.failure_reason is not None:
                changed = snap.changed_files if snap else []
                with contextlib.suppress(Exception):
                    await w.gate.stop(
                        self._gate_ctx(),
                        summary=outcome.summary,
                        turns=getattr(self, "turns", 0),
                        changed_files=changed,
                    )
        if outcome.summary:
            await self.writer.emit("summary", Summary(text=outcome.summary))
        if outcome.error and not stopped:
            await self.writer.emit("notice", Notice(text=outcome.error, level="error"))
        await self.writer.close()
        await self._finish_in_db(outcome, run_state, snap)
        if self.workspace is not None:
            await asyncio.to_thread(_remove_workspace, self.workspace)

    def _host(self) -> str:
        return urlsplit(self.w.settings.effective_base_url).hostname or "localhost"

    def _agent_identity(self) -> Identity:
        return Identity(name=self.agent_login, email=f"{self.agent_login.lower()}@bots.{self._host()}")

    def _message(self, outcome: Outcome, state: RunState, wip: bool) -> str:
        ref = f"{self.full_name}#{self.number}, run {self.run_seq}"
        if wip:
            why = outcome.error or state.value
            return f"WIP: {self.title}\n\nWork in progress: the run ended {state.value} ({why}).\n\nTask {ref}\n"
        body = f"\n\n{outcome.summary}" if outcome.summary else ""
        return f"{self.title}{body}\n\nTask {ref}\n"

    async def _finish_in_db(self, outcome: Outcome, run_state: RunState, snap: gitops.Snapshot | None) -> None:
        w = self.w
        base_url = w.settings.effective_base_url
        async with w.db.session(write=True) as s:
            run = await s.get(Run, self.run_id)
            task = (await s.execute(select(Task).where(Task.id == self.task_id).with_for_update())).scalar_one()
            repo = await s.get(Repository, task.repo_id)
            assert run is not None and repo is not None
            run.state = run_state
            run.exit_code = outcome.exit_code
            run.error = "" if run_state is RunState.STOPPED else outcome.error
            run.failure_reason = (
                (outcome.failure_reason.value if outcome.failure_reason else "") if run_state is RunState.FAILED else ""
            )
            run.finished_at = utcnow()
            run.turns = getattr(self, "turns", 0)
            run.prompt_tokens = getattr(self, "prompt_tokens", 0)
            run.completion_tokens = getattr(self, "completion_tokens", 0)
            if snap is not None:
                run.end_sha = snap.sha
                run.skipped = [{"path": x.path, "reason": x.reason} for x in snap.skipped]
                if snap.committed or not task.head_sha:
                    task.head_sha = snap.sha
                    task.head_is_wip = snap.committed and run_state in (RunState.FAILED, RunState.STOPPED)
            if outcome.conversation is not None:
                task.conversation = outcome.conversation
            if outcome.summary:
                task.summary = outcome.summary
            await publish(s, w.bus, "run.finished", task, repo, base_url=base_url, run=run, data=_run_data(run))
            current = TaskState(task.state)
            if current is not TaskState.RUNNING:
                return  # settled elsewhere (recovered as interrupted by another worker)
            if run_state is RunState.STOPPED:
                task.queued_message = ""
                await set_state(s, w.bus, task, repo, TaskState.STOPPED, base_url=base_url, run=run)
            elif run_state is RunState.BLOCKED:
                task.question = outcome.question
                if outcome.approval is not None:
                    await approvals.park(
                        s,
                        w.bus,
                        task,
                        repo,
                        run,
                        outcome.approval,
                        ttl_seconds=w.settings.task_approval_ttl_seconds,
                        base_url=base_url,
                    )
                await set_state(s, w.bus, task, repo, TaskState.BLOCKED, base_url=base_url, run=run)
            elif task.queued_message:
                body, task.queued_message = task.queued_message, ""
                seq = int((await s.execute(select(func.max(Run.seq)).where(Run.task_id == task.id))).scalar_one() or 0)
                nxt = Run(
                    task_id=task.id,
                    repo_id=task.repo_id,
                    seq=seq + 1,
                    kind=RunKind.MESSAGE,
                    state=RunState.QUEUED,
                    prompt=body,
                    skipped=[],
                )
                s.add(nxt)
                await s.flush()
                if run_state is RunState.FAILED:
                    task.error = outcome.error
                    task.failure_reason = outcome.failure_reason.value if outcome.failure_reason else ""
                await transcript.append(
                    s, task.id, [Pending(kind="prompt", payload=Prompt(text=body, source="message"), run_id=nxt.id)]
                )
                await set_state(s, w.bus, task, repo, TaskState.QUEUED, base_url=base_url, run=nxt)
            elif run_state is RunState.SUCCEEDED:
                task.error = ""
                task.failure_reason = ""
                await set_state(s, w.bus, task, repo, TaskState.AWAITING_REVIEW, base_url=base_url, run=run)
            else:
                task.error = outcome.error
                task.failure_reason = (
                    outcome.failure_reason.value if outcome.failure_reason else FailureReason.INTERNAL.value
                )
                await set_state(s, w.bus, task, repo, TaskState.FAILED, base_url=base_url, run=run)
        w.hub.notify(self.task_id)
        w.wake()


class _ProvisionFailed(Exception):
    def __init__(self, reason: FailureReason, message: str) -> None:
        super().__init__(message)
        self.reason = reason
