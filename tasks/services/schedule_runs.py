"""Firing schedules: the loop every worker process runs (`TaskSystem.start_worker`), and one slot's
claim.

A slot is taken once, whatever the number of processes: the write transaction that starts (or
skips) it first moves `next_run_at` from the value the claimer read to the next slot after now, by
compare-and-swap (`UPDATE ... WHERE next_run_at = <read>`), on PostgreSQL after locking the row with
`FOR UPDATE SKIP LOCKED` (another claimer passes over it instead of waiting); a claimer whose swap
matched nothing leaves. Missed slots (the processes were down) fire once: the next slot is the
first one after now, not after the missed one.

A slot starts nothing, and says why (`last_skip_reason`, `schedule.triggered` with `skipped`), when
the schedule's previous task is still working (queued, running or blocked), or when the start is
refused (the starter lost the right, the bot's access, the base branch ...). The loop sleeps until
the earliest `next_run_at` (at most `MAX_SLEEP`), or until a change of a schedule in this process
wakes it."""

import asyncio
import contextlib
from collections.abc import Callable
from datetime import datetime
from typing import NamedTuple

import structlog
from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from forge.core.errors import ForgeError
from forge.db.engine import Database, utcnow
from forge.db.events import AccountRef, Event, ScheduleTriggered
from forge.db.models import Account, Repository
from tasks.core.cron import next_slot
from tasks.core.lifecycle import account_ref
from tasks.core.models import Schedule, Task
from tasks.core.schemas import Trigger
from tasks.core.states import TaskState
from tasks.services.schedules import task_create
from tasks.services.tasks import TaskService
from tasks.services.triggered import principal_of, start_triggered

log = structlog.get_logger("forgehand.tasks")

MAX_SLEEP = 60.0  # a schedule changed in another process is seen within this
MIN_SLEEP = 1.0  # a slot another process holds is looked at again after this
# A previous task in one of these states holds the next slot back: it is still working on it.
BUSY_STATES = (TaskState.QUEUED, TaskState.RUNNING, TaskState.BLOCKED)
BATCH = 50


class Due(NamedTuple):
    """A schedule whose slot has come, as the claimer read it (its `next_run_at` is the swap's guard)."""

    id: int
    next_run_at: datetime


class Fired(NamedTuple):
    schedule_id: int
    task_id: int | None
    reason: str  # why nothing started ("" when a task did)


class ScheduleRunner:
    """Claims due slots and starts their tasks through the task service (`service(session)`)."""

    def __init__(
        self,
        db: Database,
        service: Callable[[AsyncSession], TaskService],
        *,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.db = db
        self.service = service
        self.clock = clock
        self._wake = asyncio.Event()
        self._loop: asyncio.Task[None] | None = None
        self.sleeping = False  # the loop waits for its time or a wake-up (tests look at it)

    # --- one pass -----------------------------------------------------------------------------

    async def due(self, now: datetime) -> list[Due]:
        """Unpaused schedules whose `next_run_at` has come, oldest first."""
        async with self.db.session() as s:
            rows = await s.execute(
                select(Schedule.id, Schedule.next_run_at)
                .where(Schedule.paused.is_(False), Schedule.next_run_at <= now)
                .order_by(Schedule.next_run_at, Schedule.id)
                .limit(BATCH)
            )
            return [Due(i, at) for i, at in rows.tuples()]

    async def fire(self, due: Due, now: datetime) -> Fired | None:
        """Claim `due`'s slot and start (or skip) it, in one write transaction; None when another
        claimer took it first, or the schedule changed since it was read."""
        async with self.db.session(write=True) as s:
            stmt = select(Schedule).where(
                Schedule.id == due.id, Schedule.next_run_at == due.next_run_at, Schedule.paused.is_(False)
            )
            if s.get_bind().dialect.name == "postgresql":
                stmt = stmt.with_for_update(skip_locked=True)
            schedule = (await s.execute(stmt)).scalar_one_or_none()
            if schedule is None:
                return None
            upcoming = next_slot(schedule.cron, schedule.timezone, max(now, due.next_run_at))
            swapped = await s.execute(
                update(Schedule)
                .where(Schedule.id == due.id, Schedule.next_run_at == due.next_run_at)
                .values(next_run_at=upcoming, last_run_at=now)
                .execution_options(synchronize_session=False)
            )
            if getattr(swapped, "rowcount", 0) != 1:
                return None
            await s.refresh(schedule)
            return await self._run_slot(s, schedule)

    async def _run_slot(self, s: AsyncSession, schedule: Schedule) -> Fired:
        repo = await s.get(Repository, schedule.repo_id)
        assert repo is not None  # the schedule goes with its repository
        svc = self.service(s)
        task: Task | None = None
        reason = await busy_reason(s, schedule)
        if not reason:
            try:
                async with s.begin_nested():  # a refused start leaves the claim and its record
                    task = await start_triggered(
                        svc,
                        starter_id=schedule.starter_id,
                        repo=repo,
                        data=task_create(schedule, await agent_login(s, schedule)),
                        trigger=Trigger.for_schedule(schedule.id, schedule.name),
                    )
            except ForgeError as exc:
                reason = f"the task could not start: {exc.detail}"
            except Exception:  # the slot is still taken: a failing start must not retry every second
                log.exception("a schedule's task could not start", schedule=schedule.id)
                reason = "the task could not start: an internal error (see the server's log)"
        schedule.last_task_id = task.id if task is not None else schedule.last_task_id
        schedule.last_skip_reason = reason
        await publish_triggered(svc, s, schedule, repo, task, reason)
        log.info("schedule fired", schedule=schedule.id, task=task.number if task else None, skipped=reason or None)
        return Fired(schedule.id, task.id if task is not None else None, reason)

    async def tick(self) -> float:
        """Fire every due slot; the seconds until the next one (within `MIN_SLEEP`..`MAX_SLEEP`)."""
        now = self.clock()
        for due in await self.due(now):
            try:
                await self.fire(due, now)
            except Exception:
                log.exception("firing a schedule failed", schedule=due.id)
        async with self.db.session() as s:
            earliest = (
                await s.execute(select(func.min(Schedule.next_run_at)).where(Schedule.paused.is_(False)))
            ).scalar_one_or_none()
        if earliest is None:
            return MAX_SLEEP
        return min(MAX_SLEEP, max(MIN_SLEEP, (earliest - self.clock()).total_seconds()))

    # --- the loop -----------------------------------------------------------------------------

    def wake(self) -> None:
        """A schedule changed: look again now (what `Schedules` calls after its commit)."""
        self._wake.set()

    def start(self) -> None:
        self._loop = asyncio.create_task(self._run(), name="forgehand-schedules")

    async def stop(self) -> None:
        if self._loop is not None:
            self._loop.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop
            self._loop = None

    async def _run(self) -> None:
        while True:
            try:
                wait = await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("the schedule loop failed")
                wait = MAX_SLEEP
            self.sleeping = True
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._wake.wait()
            self.sleeping = False
            self._wake.clear()


async def busy_reason(s: AsyncSession, schedule: Schedule) -> str:
    """Why the slot waits for the previous task ("" when it does not)."""
    if schedule.last_task_id is None:
        return ""
    last = await s.get(Task, schedule.last_task_id)
    if last is None or TaskState(last.state) not in BUSY_STATES:
        return ""
    return f"its previous task #{last.number} is still {last.state}"


async def agent_login(s: AsyncSession, schedule: Schedule) -> str:
    agent = await s.get(Account, schedule.agent_id)
    return agent.login if agent is not None else ""


async def publish_triggered(
    svc: TaskService, s: AsyncSession, schedule: Schedule, repo: Repository, task: Task | None, reason: str
) -> None:
    """`schedule.triggered`: with the task it started (`meta.task`), or skipped with the reason
    (`meta.task` null); `meta.actor` is the starter, `meta.agent` the schedule's bot."""
    data = ScheduleTriggered(
        schedule_id=schedule.id,
        name=schedule.name,
        cron=schedule.cron,
        timezone=schedule.timezone,
        skipped=task is None,
        reason=reason,
    )
    starter = await s.get(Account, schedule.starter_id) if schedule.starter_id is not None else None
    principal = principal_of(starter) if starter is not None else None
    if task is not None:
        await svc.life.publish("schedule.triggered", task, repo, actor=principal, data=data)
        return
    event = Event(
        repo_id=repo.id,
        repo_uuid=repo.uuid,
        repository=f"{repo.owner.login}/{repo.name}",
        actor=AccountRef.of(principal),
        agent=await account_ref(s, schedule.agent_id),
        data=data,
    )
    await svc.bus.publish(s, event)
