"""What the app (or `forgehand worker`) holds for tasks: the live hub, the policy gate, the worker,
and the services built on a session. The composition root builds one and puts it on
`app.state.tasks`."""

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import structlog
from sqlalchemy.ext.asyncio import AsyncSession

from forge.core.settings import Settings
from forge.db.engine import Database
from forge.db.events import EventBus
from forge.db.wakeups import Wakeups, for_database
from forge.git import RepoStore
from forge.notify.notifier import Notifications
from sandbox import DEFAULT_AGENTS_IMAGE, DEFAULT_IMAGE, SandboxEngine, installed_agents
from tasks.core import egress_config
from tasks.core.agent_registry import AgentInfo, registry
from tasks.core.live import LiveHub
from tasks.core.policy import AllowAll, PolicyGate
from tasks.run.runtimes import RUNTIMES
from tasks.run.webhook_gate import WebhookGate
from tasks.run.worker import TaskWorker
from tasks.services import agent_triggers, merge_intents
from tasks.services.merge import MergeService
from tasks.services.schedule_runs import ScheduleRunner
from tasks.services.schedules import Schedules
from tasks.services.task_people import task_people
from tasks.services.tasks import TaskService
from webhooks.wiring import wire as wire_webhooks

log = structlog.get_logger("forgehand.tasks")

RECONCILE_SECONDS = 300.0
SAFETY_POLL_SECONDS = 2.0  # readers' poll when other processes' changes are heard (LISTEN/NOTIFY)
AGENTS_TTL_SECONDS = 60.0  # how long the start form trusts what it read of the agents image


class TaskSystem:
    def __init__(
        self,
        db: Database,
        settings: Settings,
        store: RepoStore,
        bus: EventBus,
        *,
        gate: PolicyGate | None = None,
        hub: LiveHub | None = None,
    ) -> None:
        # Bad egress settings (FORGEHAND_EGRESS_*) stop the start, naming the variable.
        egress_config.check_operator(settings)
        self.db = db
        self.settings = settings
        self.store = store
        self.bus = bus
        self.gate: PolicyGate = gate or AllowAll()
        self.hub = hub or LiveHub()
        self.worker: TaskWorker | None = None
        self.wakeups: Wakeups | None = None
        self.schedule_runner: ScheduleRunner | None = None
        self._recovery: asyncio.Task[None] | None = None
        self._agents: tuple[float, dict[str, str]] | None = None
        # A task started from an issue tells its progress on the timeline.
        bus.subscribe(agent_triggers.on_event)

    def service(self, session: AsyncSession) -> TaskService:
        """The task service on `session`. What it changes wakes live views and the worker (they
        listen to the hub) once the session commits."""
        return TaskService(
            session, bus=self.bus, store=self.store, settings=self.settings, gate=self.gate, changed=self.hub.notify
        )

    def schedules(self, session: AsyncSession) -> Schedules:
        """The schedules service on `session`; a change wakes this process's schedule loop after
        the commit."""
        return Schedules(session, self.settings, self.store, changed=self.wake_schedules)

    def wake_schedules(self) -> None:
        if self.schedule_runner is not None:
            self.schedule_runner.wake()

    @asynccontextmanager
    async def new(self, *, write: bool = False) -> AsyncIterator[TaskService]:
        """The task service on a session of its own, outside a request (CLI, scripts, tests)."""
        async with self.db.session(write=write) as session:
            yield self.service(session)

    async def installed_agents(self) -> dict[str, str]:
        """The CLI agents in the agents image (name -> version, from its labels), for the start
        form; {} when there is no image or no engine. Cached for a minute."""
        now = asyncio.get_running_loop().time()
        if self._agents is not None and now - self._agents[0] < AGENTS_TTL_SECONDS:
            return self._agents[1]
        found: dict[str, str] = {}
        with contextlib.suppress(Exception):
            async with SandboxEngine() as engine:
                async with asyncio.timeout(10):
                    found = await installed_agents(engine, DEFAULT_AGENTS_IMAGE)
        self._agents = (now, found)
        return found

    async def agent_registry(self) -> list[AgentInfo]:
        """Every runtime of the instance with its version, image and policy layers (the agents
        image's labels, cached as `installed_agents`)."""
        return registry(
            RUNTIMES,
            await self.installed_agents(),
            acp_path=self.settings.acp_agents,
            plain_image=self.settings.sandbox_image or DEFAULT_IMAGE,
            agents_image=DEFAULT_AGENTS_IMAGE,
        )

    def merge_service(self) -> MergeService:
        return MergeService(self.db, self.service)

    def make_worker(self, *, engine: SandboxEngine | None = None, extra_secrets: tuple[str, ...] = ()) -> TaskWorker:
        return TaskWorker(
            self.db,
            self.settings,
            self.store,
            self.bus,
            self.hub,
            self.gate,
            engine=engine,
            extra_secrets=extra_secrets,
        )

    async def start_wakeups(self) -> None:
        """On PostgreSQL, carry the hub's notifications to and from the other processes
        (`LISTEN/NOTIFY`); readers then poll only as a safety net, every 2 s."""
        self.wakeups = for_database(self.settings.effective_database_url, self.hub.notify_remote)
        if self.wakeups is not None:
            await self.wakeups.start()
            self.hub.set_relay(self.wakeups.publish, poll_seconds=SAFETY_POLL_SECONDS)

    async def stop_wakeups(self) -> None:
        if self.wakeups is not None:
            self.hub.set_relay(None)
            await self.wakeups.stop()
            self.wakeups = None

    async def start_recovery(self) -> None:
        """Finish or drop the merges a crash interrupted, now and every `RECONCILE_SECONDS`."""
        await merge_intents.reconcile(self.db, self.service)
        self._recovery = asyncio.create_task(self._recovery_loop())

    async def stop_recovery(self) -> None:
        if self._recovery is not None:
            self._recovery.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._recovery
            self._recovery = None

    async def _recovery_loop(self) -> None:
        while True:
            await asyncio.sleep(RECONCILE_SECONDS)
            try:
                await merge_intents.reconcile(self.db, self.service)
            except Exception:
                log.exception("reconciling merges failed")

    async def start_worker(self) -> TaskWorker:
        """The worker, and beside it the loop that starts the schedules' tasks."""
        self.worker = self.make_worker()
        await self.worker.start()
        self.schedule_runner = ScheduleRunner(self.db, self.service)
        self.schedule_runner.start()
        return self.worker

    async def stop_worker(self) -> None:
        if self.schedule_runner is not None:
            await self.schedule_runner.stop()
            self.schedule_runner = None
        if self.worker is not None:
            await self.worker.close()
            self.worker = None


async def run_worker_process(settings: Settings) -> None:
    """`forgehand worker`: a worker in its own process (another machine with a Docker engine).

    Its changes wake the web processes' live views through the database (`start_wakeups`), and
    theirs (a run queued, a stop asked) wake it."""
    import signal

    db = Database(settings.effective_database_url)
    store = RepoStore(settings.data_dir / "repos")
    bus = EventBus()
    # Events of runs in this process go to the webhooks outbox too, and it delivers them.
    hooks = wire_webhooks(bus, settings, db)
    # ... and to the notifications (a task waiting for its starter), whose mailer runs here too.
    notifications = Notifications(db, settings, tasks=task_people)
    bus.subscribe(notifications.notifier)
    system = TaskSystem(db, settings, store, bus, gate=WebhookGate(hooks.policy, db))
    await system.start_wakeups()
    await system.start_worker()
    await hooks.start()
    await notifications.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await notifications.stop()
        await hooks.stop()
        await system.stop_worker()
        await system.stop_wakeups()
        await store.close()
        await db.dispose()
