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
from sqlalchemy.ext.asyncio import AsyncSession

from forge.core.settings import Settings
from forge.core.version import VERSION
from forge.db.engine import Database, utcnow
from forge.db.events import EventBus
from forge.db.models import Repository
from forge.git import RepoStore
from sandbox import DEFAULT_IMAGE, SandboxEngine, quota_unavailable_reason
from tasks.core import payloads, worker_registry
from tasks.core.live import LiveHub
from tasks.core.models import Run, Task
from tasks.core.parked import expire_due
from tasks.core.policy import PolicyGate
from tasks.core.states import FailureReason, RunState, TaskState
from tasks.core.worker_models import WorkerRecord
from tasks.run import recovery, warm
from tasks.run.env import RunEnv
from tasks.run.execution import Execution
from tasks.run.runtimes import default_runtimes
from tasks.run.runtimes.base import Runtime

log = structlog.get_logger("forgehand.tasks")

HEARTBEAT_SECONDS = 1.0
APPROVAL_SWEEP_SECONDS = 2.0
ENGINE_CHECK_SECONDS = 5.0  # how often the engine is pinged (a failed ping stops the claiming)
ENGINE_PING_TIMEOUT = 10.0


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
        self.lease = settings.worker_lease_seconds
        # The engine it runs sandboxes on, as the register names it (other workers reach it there
        # to remove this worker's containers once its lease lapses).
        self.docker_host = worker_registry.engine_label(self.engine.base_url or os.environ.get("DOCKER_HOST", ""))
        self.engine_ok = True
        self.engine_error = ""
        self._last_beat = 0.0
        self._ping_failures = 0
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
        await self.check_engine()
        await self._register()  # with its engine's state: /healthz tells it from the start
        await self.recover(reap_containers=True)
        self.env.pools.update(await warm.open_pools(self.env, recovery.workspaces_root(self.env)))
        self.hub.listen(self.on_task_changed)
        self._bg = [
            asyncio.create_task(self._claim_loop()),
            asyncio.create_task(self._heartbeat_loop()),
            asyncio.create_task(self._expire_loop()),
            asyncio.create_task(self._engine_loop()),
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
        with contextlib.suppress(Exception):
            async with self.db.session(write=True) as s:
                await worker_registry.stopped(s, self.id)
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
                # Twice per lease: a lapsed lease is taken over within 1.5 leases of the last beat.
                if time.monotonic() - last_recover > self.lease / 2:
                    last_recover = time.monotonic()
                    await self.recover(reap_containers=True)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("claiming runs failed")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.hub.poll_seconds):
                    await self._wake.wait()
            self._wake.clear()

    async def claim_once(self) -> int:
        """Claim what this worker has room for (its capacity less the runs it runs) and start it:
        how many runs it claimed."""
        free = self.capacity - len(self._running)
        if free <= 0 or not self.engine_ok:
            return 0  # full, or no engine to run them on (it says so: /healthz, the admin page)
        claimed = await self._claim(free)
        for run_id, task_id in claimed:
            self._spawn(run_id, task_id)
        return len(claimed)

    async def _claim(self, free: int) -> list[tuple[int, int]]:
        """Up to `free` queued runs this worker may take (its labels, repositories below their
        concurrency), claimed in one transaction. Only `free` rows are read and, on PostgreSQL,
        locked (SKIP LOCKED): a worker claiming at the same moment takes the next ones instead of
        finding every queued run locked by this one until it commits."""
        claimed: list[tuple[int, int]] = []
        async with self.db.session(write=True) as s:
            life = self.env.lifecycle(s)
            busy = await self._busy_repos(s)
            full = [repo_id for repo_id, n in busy.items() if n >= self.settings.task_repo_concurrency]
            dialect = s.get_bind().dialect.name
            stmt = (
                select(Run)
                .where(Run.state == RunState.QUEUED, labels_fit(dialect, self.labels), Run.repo_id.not_in(full))
                .order_by(Run.id)
                .limit(free)
            )
            if dialect == "postgresql":
                stmt = stmt.with_for_update(skip_locked=True)
            rows = (await s.execute(stmt)).scalars().all()
            for run in rows:
                if busy.get(run.repo_id, 0) >= self.settings.task_repo_concurrency:
                    continue  # its repository filled up within this claim
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
        if len(rows) == free and len(claimed) < free:
            self._wake.set()  # it passed over some of what it read: there may be more to take, look again
        return claimed

    @staticmethod
    async def _busy_repos(s: AsyncSession) -> dict[int, int]:
        """Running runs per repository."""
        counted = await s.execute(
            select(Run.repo_id, func.count(Run.id)).where(Run.state == RunState.RUNNING).group_by(Run.repo_id)
        )
        return dict(counted.tuples().all())

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

    # --- the register and the engine -------------------------------------------------------

    async def _register(self) -> None:
        record = WorkerRecord(
            id=self.id,
            host=socket.gethostname(),
            pid=os.getpid(),
            engine=self.docker_host,
            labels=sorted(self.labels),
            capacity=self.capacity,
            version=VERSION,
            running=0,
            engine_ok=self.engine_ok,
            engine_error=self.engine_error,
        )
        async with self.db.session(write=True) as s:
            await worker_registry.register(s, record)

    async def check_engine(self, *, confirm: bool = False) -> bool:
        """Ping the engine; a change of its state is logged and written to the register at once.
        With `confirm`, one failed ping is not enough: a busy engine (or this worker's own engine
        threads, all at work) may miss one, and a worker that stopped claiming for it would idle."""
        try:
            async with asyncio.timeout(ENGINE_PING_TIMEOUT):
                await self.engine.ping()
        except Exception as exc:
            error = f"the Docker engine {self.docker_host or '(default socket)'} does not answer: {exc}"[:500]
            self._ping_failures += 1
            ok = confirm and self._ping_failures < 2 and self.engine_ok
        else:
            error, ok = "", True
            self._ping_failures = 0
        if ok != self.engine_ok:
            if ok:
                log.info("the Docker engine answers again: claiming runs", worker=self.id)
            else:
                log.error("the Docker engine does not answer: no runs are claimed", worker=self.id, error=error)
            self.engine_ok, self.engine_error = ok, error
            self._last_beat = 0.0  # told in the register at the next beat
            self._check_stops.set()
            if ok:
                self._wake.set()
        return ok

    async def _engine_loop(self) -> None:
        while not self._closing:
            await asyncio.sleep(ENGINE_CHECK_SECONDS)
            await self.check_engine(confirm=True)

    async def _heartbeat_loop(self) -> None:
        """Every second: renew the lease of the runs this worker owns, hear their stop requests,
        stop the runs whose lease another worker took over; every few seconds, its own row."""
        while not self._closing:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(HEARTBEAT_SECONDS):
                    await self._check_stops.wait()
            self._check_stops.clear()
            try:
                stopping = await self._beat()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("heartbeat failed")
                continue
            for run_id in stopping:
                event = self._stop_events.get(run_id)
                if event is not None:
                    event.set()

    async def _beat(self) -> list[int]:
        """One beat; the runs to stop (asked to, or no longer this worker's)."""
        owned = list(self._running)
        register_due = time.monotonic() - self._last_beat > min(5.0, self.lease / 3)
        if not owned and not register_due:
            return []
        async with self.db.session(write=True) as s:
            stopping: list[int] = []
            if owned:
                await s.execute(
                    update(Run)
                    .where(Run.id.in_(owned), Run.owner == self.id, Run.state == RunState.RUNNING)
                    .values(heartbeat_at=utcnow())
                    .execution_options(synchronize_session=False)
                )
                found = select(Run.id, Run.owner, Run.state, Run.failure_reason, Run.stop_requested).where(
                    Run.id.in_(owned)
                )
                for run_id, owner, state, reason, stop in (await s.execute(found)).all():
                    # Taken over: another worker's recovery ended it `interrupted` (a run this
                    # worker settled itself is simply not running any more).
                    lost = owner != self.id or (state != RunState.RUNNING and reason == FailureReason.INTERRUPTED)
                    if lost:
                        log.warning("a run's lease was taken over: stopping it here", run_id=run_id, worker=self.id)
                    if lost or (stop and state == RunState.RUNNING):
                        stopping.append(run_id)
            if register_due:
                await worker_registry.beat(
                    s, self.id, running=len(owned), engine_ok=self.engine_ok, engine_error=self.engine_error
                )
                self._last_beat = time.monotonic()
        return stopping
