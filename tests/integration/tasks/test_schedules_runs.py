"""A schedule's slots, fired by the schedule loop's pass (`ScheduleRunner`) on an injected clock: a
due slot starts exactly one task marked `trigger.kind == "schedule"` (its JSON, `meta.task` of its
events), a slot whose previous task still works is skipped and says so, missed slots after a
downtime start one task, a paused schedule starts nothing, two claimers racing for one slot start
one task, and a starter who lost the right is skipped with the reason. No worker: the tasks stay
queued, which is what "still working" needs."""

import asyncio
from datetime import datetime, timedelta
from typing import Any

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from forge.core.settings import Settings
from forge.db.engine import Database
from forge.db.events import Event, ScheduleTriggered
from tasks.core.models import Task
from tasks.core.policy import AllowAll, GateContext, GateDecision, PromptKind
from tasks.core.states import TaskState
from tasks.services.schedule_runs import ScheduleRunner
from tasks.services.tasks import TaskService
from tasks.system import TaskSystem
from tests.support.task_world import World, build_task_world
from tests.support.waiting import until

pytestmark = pytest.mark.db

SCHEDULES = "/api/v1/repos/ana/demo/schedules"
TASKS = "/api/v1/repos/ana/demo/tasks"
EVERY_5 = {"name": "every five", "cron": "*/5 * * * *", "goal": "Tidy up", "agent": "fixer", "command": "true"}


class Clock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
async def world(db: Database, settings: Settings) -> World:
    return await build_task_world(db, settings)


@pytest.fixture
def published(app: Litestar) -> list[Event]:
    seen: list[Event] = []

    async def record(_: Any, event: Event) -> None:
        seen.append(event)

    app.state.bus.subscribe(record)
    return seen


async def create(client: AsyncTestClient[Litestar], world: World, who: str = "ana", **kw: Any) -> dict[str, Any]:
    r = await client.post(SCHEDULES, json={**EVERY_5, **kw}, headers=world.h(who))
    assert r.status_code == 201, r.text
    return dict(r.json())


def runner_at(
    app: Litestar, db: Database, schedule: dict[str, Any], later: timedelta = timedelta(seconds=1)
) -> ScheduleRunner:
    """A runner of the app's task system whose clock stands `later` after the schedule's next run,
    on the test's own database handle (the app's connections belong to the test client's loop)."""
    system: TaskSystem = app.state.tasks
    now = datetime.fromisoformat(schedule["next_run_at"]) + later
    return ScheduleRunner(db, system.service, clock=Clock(now))


async def task_count(db: Database) -> int:
    async with db.session() as s:
        return int((await s.execute(select(func.count(Task.id)))).scalar_one())


def triggered(published: list[Event]) -> list[ScheduleTriggered]:
    return [e.data for e in published if isinstance(e.data, ScheduleTriggered)]


async def test_a_due_slot_starts_one_task_marked_by_its_schedule(
    app: Litestar, client: AsyncTestClient[Litestar], world: World, db: Database, published: list[Event]
) -> None:
    made = await create(client, world)
    runner = runner_at(app, db, made)
    assert await runner.tick() >= 1.0  # the next slot is 5 minutes away: it sleeps (at most a minute)
    assert await task_count(db) == 1
    assert await runner.tick() and await task_count(db) == 1  # the same slot never fires twice

    task = (await client.get(f"{TASKS}/1", headers=world.h("ana"))).json()
    trigger = {"kind": "schedule", "issue": None, "pull_request": None, "comment": None}
    assert task["trigger"] == {**trigger, "schedule": {"id": made["id"], "name": "every five"}}
    assert task["started_by"] == "ana" and task["agent"] == "fixer" and task["goal"] == "Tidy up"
    created = [e for e in published if e.type == "task.created"]
    assert len(created) == 1 and created[0].task is not None and created[0].task.trigger is not None
    assert created[0].task.trigger.kind == "schedule" and created[0].task.trigger.schedule is not None
    assert created[0].task.trigger.schedule.id == made["id"]
    [fired] = triggered(published)
    assert fired.skipped is False and fired.reason == "" and fired.schedule_id == made["id"]
    assert [e.task.number for e in published if e.type == "schedule.triggered" and e.task] == [1]

    after = (await client.get(f"{SCHEDULES}/{made['id']}", headers=world.h("ana"))).json()
    assert after["last_task"] == {"number": 1, "html_url": "http://testserver.local/ana/demo/tasks/1"}
    assert after["last_run_at"] is not None and after["last_skip_reason"] == ""
    next_run = datetime.fromisoformat(after["next_run_at"])
    assert next_run == datetime.fromisoformat(made["next_run_at"]) + timedelta(minutes=5)

    by_hand = await client.post(TASKS, json={"goal": "g", "agent": "fixer", "command": "true"}, headers=world.h("ana"))
    assert by_hand.json()["trigger"] is None


async def test_a_slot_is_skipped_while_the_previous_task_works(
    app: Litestar, client: AsyncTestClient[Litestar], world: World, db: Database, published: list[Event]
) -> None:
    made = await create(client, world)
    await runner_at(app, db, made).tick()
    await runner_at(app, db, made, timedelta(minutes=5, seconds=1)).tick()  # the next slot; task 1 is queued
    assert await task_count(db) == 1
    first, second = triggered(published)
    assert not first.skipped and second.skipped and second.reason == "its previous task #1 is still queued"
    skipped_event = [e for e in published if e.type == "schedule.triggered"][-1]
    assert skipped_event.task is None and skipped_event.repository == "ana/demo"
    assert skipped_event.actor is not None and skipped_event.actor.login == "ana"
    after = (await client.get(f"{SCHEDULES}/{made['id']}", headers=world.h("ana"))).json()
    assert after["last_skip_reason"] == "its previous task #1 is still queued"
    assert after["last_task"]["number"] == 1

    async with db.session(write=True) as s:  # the task ends its work: the next slot starts one
        task = (await s.execute(select(Task))).scalar_one()
        task.state = TaskState.AWAITING_REVIEW
    await runner_at(app, db, made, timedelta(minutes=10, seconds=1)).tick()
    assert await task_count(db) == 2


async def test_missed_slots_after_a_downtime_start_one_task(
    app: Litestar, client: AsyncTestClient[Litestar], world: World, db: Database
) -> None:
    made = await create(client, world)
    down = timedelta(minutes=5 * 5 + 2)  # five slots went by while nothing ran
    runner = runner_at(app, db, made, down)
    await runner.tick()
    await runner.tick()
    assert await task_count(db) == 1
    after = (await client.get(f"{SCHEDULES}/{made['id']}", headers=world.h("ana"))).json()
    now = datetime.fromisoformat(made["next_run_at"]) + down
    assert datetime.fromisoformat(after["next_run_at"]) == now.replace(second=0, microsecond=0) + timedelta(minutes=3)


async def test_a_paused_schedule_starts_nothing(
    app: Litestar, client: AsyncTestClient[Litestar], world: World, db: Database, published: list[Event]
) -> None:
    made = await create(client, world, paused=True)
    r = await client.get(f"{SCHEDULES}/{made['id']}", headers=world.h("ana"))
    assert r.json()["next_run_at"] is None
    system: TaskSystem = app.state.tasks
    async with db.session() as s:
        stored = (await s.execute(select(Task))).scalars().all()
    assert stored == []
    runner = ScheduleRunner(db, system.service, clock=Clock(datetime.now().astimezone() + timedelta(days=30)))
    assert await runner.tick() == 60.0  # nothing unpaused: the longest sleep
    assert await task_count(db) == 0 and triggered(published) == []


async def test_two_claimers_racing_for_one_slot_start_one_task(
    app: Litestar, client: AsyncTestClient[Litestar], world: World, db: Database, published: list[Event]
) -> None:
    made = await create(client, world)
    system: TaskSystem = app.state.tasks
    now = datetime.fromisoformat(made["next_run_at"]) + timedelta(seconds=1)
    # Two runners (one per process in a deployment), each having read the slot as due.
    a = ScheduleRunner(db, system.service, clock=Clock(now))
    b = ScheduleRunner(db, system.service, clock=Clock(now))
    [due_a], [due_b] = await a.due(now), await b.due(now)
    assert due_a == due_b
    results = await asyncio.gather(a.fire(due_a, now), b.fire(due_b, now))
    assert sorted(r is None for r in results) == [False, True]  # one took it, the other found it gone
    assert await task_count(db) == 1
    assert len(triggered(published)) == 1


async def test_runners_of_several_processes_ticking_together_start_one_task_per_slot(
    app: Litestar, client: AsyncTestClient[Litestar], world: World, settings: Settings, db: Database
) -> None:
    """Four runners, each with its own connection pool (as four `forgehand serve` or `worker`
    processes against one database), tick together over three schedules' due slots: every slot
    starts exactly one task, whichever runner claims it (on PostgreSQL `FOR UPDATE SKIP LOCKED`
    and the compare-and-swap; on SQLite the write lock and the compare-and-swap)."""
    made = [await create(client, world, name=f"every five {i}") for i in range(3)]
    system: TaskSystem = app.state.tasks
    now = max(datetime.fromisoformat(m["next_run_at"]) for m in made) + timedelta(seconds=1)
    handles = [Database(settings.effective_database_url) for _ in range(4)]
    try:
        runners = [ScheduleRunner(h, system.service, clock=Clock(now)) for h in handles]
        await asyncio.gather(*(r.tick() for r in runners))
        await asyncio.gather(*(r.tick() for r in runners))  # a second pass finds nothing due
    finally:
        for h in handles:
            await h.dispose()
    async with db.session() as s:
        triggers = (await s.execute(select(Task.trigger))).scalars().all()
    started = sorted(t["schedule"]["id"] for t in triggers if t and t["kind"] == "schedule")
    assert started == sorted(m["id"] for m in made)  # each schedule's slot: one task


async def test_a_starter_who_lost_the_right_is_skipped_with_the_reason(
    app: Litestar, client: AsyncTestClient[Litestar], world: World, db: Database, published: list[Event]
) -> None:
    collaborators = "/api/v1/repos/ana/demo/collaborators/wendy"
    assert (await client.put(collaborators, json={"role": "admin"}, headers=world.h("ana"))).status_code < 300
    made = await create(client, world, who="wendy")
    assert made["starter"] == "wendy"
    assert (await client.put(collaborators, json={"role": "read"}, headers=world.h("ana"))).status_code < 300
    await runner_at(app, db, made).tick()
    assert await task_count(db) == 0
    [skipped] = triggered(published)
    assert skipped.skipped and skipped.reason == "the task could not start: wendy may no longer start tasks in ana/demo"
    after = (await client.get(f"{SCHEDULES}/{made['id']}", headers=world.h("ana"))).json()
    assert after["last_skip_reason"] == skipped.reason and after["last_task"] is None


async def test_the_loop_sleeps_until_woken_by_a_change(
    app: Litestar, client: AsyncTestClient[Litestar], world: World, db: Database
) -> None:
    made = await create(client, world)
    clock = Clock(datetime.fromisoformat(made["next_run_at"]) - timedelta(minutes=1))  # nothing due yet
    system: TaskSystem = app.state.tasks
    runner = ScheduleRunner(db, system.service, clock=clock)
    runner.start()
    try:
        await until(lambda: runner.sleeping, timeout=30, what="the loop's first pass")
        assert await task_count(db) == 0
        clock.now += timedelta(minutes=2)  # the slot came; the loop sleeps up to a minute unless woken
        runner.wake()
        await until(task_count_is(db, 1), timeout=30, what="the woken loop to start the slot's task")
    finally:
        await runner.stop()


def task_count_is(db: Database, n: int) -> Any:
    async def check() -> bool:
        return await task_count(db) == n

    return check


class RecordingGate(AllowAll):
    """Allows every prompt, keeping what the policy was told about each."""

    def __init__(self) -> None:
        self.asked: list[GateContext] = []

    async def user_prompt_submit(
        self, ctx: GateContext, *, prompt: str, kind: PromptKind, session: Any = None
    ) -> GateDecision:
        self.asked.append(ctx)
        return await super().user_prompt_submit(ctx, prompt=prompt, kind=kind, session=session)


async def test_the_policy_is_told_what_started_the_task(
    app: Litestar, client: AsyncTestClient[Litestar], world: World, db: Database
) -> None:
    made = await create(client, world)
    system: TaskSystem = app.state.tasks
    gate = RecordingGate()

    def service(session: AsyncSession) -> TaskService:
        return TaskService(session, bus=system.bus, store=system.store, settings=system.settings, gate=gate)

    now = datetime.fromisoformat(made["next_run_at"]) + timedelta(seconds=1)
    await ScheduleRunner(db, service, clock=Clock(now)).tick()
    [ctx] = gate.asked  # the goal's user_prompt_submit, in the slot's transaction
    assert ctx.trigger is not None and ctx.trigger.kind == "schedule"
    assert ctx.trigger.schedule is not None and ctx.trigger.schedule.name == "every five"
    assert ctx.actor_login == "ana"
