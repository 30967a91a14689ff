"""The worker: claims queued runs, provisions a workspace and a sandbox, runs the runtime, takes the
snapshot commit and settles the task. In-process (the app's lifespan) or `forgehand worker`.

Concurrency: at most `worker_capacity` (default `task_concurrency`) runs per worker and
`task_repo_concurrency` running runs per repository. A worker claims only runs whose task requires
no label it lacks (`worker_labels`; the filter is in the claim's query, so the rows it locks are
the ones it may take). Each owned run carries the worker's id and a heartbeat; at start-up (and
periodically) runs whose owner is gone are failed as `interrupted` (their workspaces snapshotted as the WIP
commit, then removed) and their containers reaped (tasks/run/recovery.py)."""

import asyncio
import contextlib
import json
import os
import secrets
import socket
import time

import structlog
from sqlalchemy import ColumnElement, cast, exists, func, literal, select, update
from sqlalchemy.dialects.postgresql import JSONB

from forge.core.settings import Settings
from forge.db.engine import Database, utcnow
from forge.db.events import EventBus
from forge.db.models import Repository
from forge.git import RepoStore
from sandbox import DEFAULT_IMAGE, SandboxEngine, quota_unavailable_reason
from tasks.core import payloads
from tasks.core.live import LiveHub
from tasks.core.models import Run, Task
from tasks.core.parked import expire_due
from tasks.core.policy import PolicyGate
from tasks.core.states import RunState, TaskState
from tasks.run import recovery, warm
from tasks.run.env import RunEnv
from tasks.run.execution import Execution
from tasks.run.runtimes import default_runtimes
from tasks.run.runtimes.base import Runtime

log = structlog.get_logger("forgehand.tasks")

HEARTBEAT_SECONDS = 1.0
RECOVER_EVERY = 30.0
APPROVAL_SWEEP_SECONDS = 2.0


def labels_fit(dialect: str, labels: frozenset[str]) -> ColumnElement[bool]:
    """A run's task requires no label outside `labels` (its `required_labels` a subset of them), as
    SQL: PostgreSQL's jsonb containment, SQLite's `json_each`."""
    required = Task.required_labels
    if dialect == "postgresql":
        fits = cast(required, JSONB).contained_by(cast(literal(json.dumps(sorted(labels))), JSONB))
    else:
        each = func.json_each(required).table_valued("value")
        fits = ~exists(select(literal(1)).select_from(each).where(each.c.value.not_in(sorted(labels))))
    return exists(select(literal(1)).where(Task.id == Run.task_id, fits))


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
        self.labels = settings.worker_label_set
        self.capacity = settings.effective_worker_capacity
        self.env = RunEnv(
            db=db,
            store=store,
            engine=self.engine,
            settings=settings,
            bus=bus,
            hub=hub,
            gate=gate,
            runtimes=self.runtimes,
            worker_id=self.id,
            image=self.image,
            instance=self.instance,
            extra_secrets=extra_secrets,
        )
        self._running: dict[int, asyncio.Task[None]] = {}
        self._task_of_run: dict[int, int] = {}
        self._stop_events: dict[int, asyncio.Event] = {}
        self._wake = asyncio.Event()
        self._check_stops = asyncio.Event()
        self._bg: list[asyncio.Task[None]] = []
        self._closing = False

    # --- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        recovery.worker_started(self.id)
        if self.settings.task_workspace_quota == "mount" and (why := quota_unavailable_reason()):
            fix = "run as root, or set FORGEHAND_TASK_WORKSPACE_QUOTA=watchdog (weaker)"
            log.error("run workspaces cannot be mounted: every run will fail", reason=why, fix=fix)
        await self.recover(reap_containers=True)
        self.env.pools.update(await warm.open_pools(self.env, recovery.workspaces_root(self.env)))
        self.hub.listen(self.on_task_changed)
        self._bg = [
            asyncio.create_task(self._claim_loop()),
            asyncio.create_task(self._heartbeat_loop()),
            asyncio.create_task(self._expire_loop()),
        ]
        log.info("task worker started", worker=self.id, labels=sorted(self.labels), capacity=self.capacity)

    async def close(self) -> None:
        """Stop claiming; runs still going end as `interrupted` (with their WIP snapshot)."""
        self._closing = True
        self.hub.unlisten(self.on_task_changed)
        for bg in self._bg:
            bg.cancel()
        for bg in self._bg:
            with contextlib.suppress(asyncio.CancelledError):
                await bg
        for run_task in list(self._running.values()):
            run_task.cancel()
        if self._running:
            await asyncio.wait(list(self._running.values()), timeout=60)
        await warm.close_pools(self.env.pools)
        recovery.worker_stopped(self.id)
        if self._own_engine:
            await self.engine.close()

    @property
    def woken(self) -> bool:
        """A wake-up is pending (the claim loop has not looked since): for tests and the bench."""
        return self._wake.is_set()

    def wake(self) -> None:
        self._wake.set()

    def on_task_changed(self, task_id: int) -> None:
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
        """Runs whose worker is gone recovered, workspaces and channels no live run owns swept
        (tasks/run/recovery.py)."""
        await recovery.recover(self.env, reap_containers=reap_containers)

    # --- claiming -----------------------------------------------------------------------------

    async def _claim_loop(self) -> None:
        last_recover = time.monotonic()
        while not self._closing:
            try:
                await self.claim_once()
                if time.monotonic() - last_recover > RECOVER_EVERY:
                    last_recover = time.monotonic()
                    await self.recover(reap_containers=True)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("claiming runs failed")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0):
                    await self._wake.wait()
            self._wake.clear()

    async def claim_once(self) -> int:
        """Claim what this worker has room for (its capacity less the runs it runs) and start it:
        how many runs it claimed."""
        free = self.capacity - len(self._running)
        if free <= 0:
            return 0
        claimed = await self._claim(free)
        for run_id, task_id in claimed:
            self._spawn(run_id, task_id)
        return len(claimed)

    async def _claim(self, free: int) -> list[tuple[int, int]]:
        """Up to `free` queued runs this worker may take (its labels), claimed in one transaction."""
        claimed: list[tuple[int, int]] = []
        async with self.db.session(write=True) as s:
            life = self.env.lifecycle(s)
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
            dialect = s.get_bind().dialect.name
            stmt = (
                select(Run)
                .where(Run.state == RunState.QUEUED, labels_fit(dialect, self.labels))
                .order_by(Run.id)
                .limit(100)
            )
            if dialect == "postgresql":
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
                await life.set_state(task, repo, TaskState.RUNNING, run=run)
                await life.publish("run.started", task, repo, run=run, data=payloads.run_started(run))
                claimed.append((run.id, task.id))
        return claimed

    def _spawn(self, run_id: int, task_id: int) -> None:
        self._stop_events[run_id] = asyncio.Event()
        self._task_of_run[run_id] = task_id

        async def go() -> None:
            try:
                await Execution(self.env, run_id, self._stop_events[run_id]).run()
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
                await expire_due(self.db, self.env.lifecycle)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("expiring approvals failed")
            await asyncio.sleep(APPROVAL_SWEEP_SECONDS)

    async def _heartbeat_loop(self) -> None:
        while not self._closing:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(HEARTBEAT_SECONDS):
                    await self._check_stops.wait()
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
