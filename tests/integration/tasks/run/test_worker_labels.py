"""Worker labels and capacity: a run goes only to a worker with every label its task requires (the
repository's task settings' and the start's), the claim filters in its query (SKIP LOCKED on
PostgreSQL locks only what the worker may take), bad labels are refused with a code, a worker claims
at most its capacity, and a queued task says which labels it waits for (JSON and page). The claim
alone is driven here: no run is started."""

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import msgspec
import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncSession

from forge.core.settings import Settings
from forge.db.engine import Database
from forge.db.events import EventBus
from forge.git import RepoStore
from tasks.core.lifecycle import Lifecycle
from tasks.core.live import LiveHub
from tasks.core.models import Task
from tasks.core.policy import AllowAll
from tasks.core.states import TaskState
from tasks.run.env import RunEnv
from tasks.run.worker import TaskWorker
from tests.support.task_world import TASKS, World, build_task_world

pytestmark = pytest.mark.db

SETTINGS = "/api/v1/repos/ana/demo/task-settings"


@pytest.fixture
async def world(db: Database, settings: Settings) -> World:
    return await build_task_world(db, settings)


@pytest.fixture
def worker_with(db: Database, settings: Settings) -> Callable[..., Any]:
    @asynccontextmanager
    async def make(**changes: Any) -> AsyncIterator[TaskWorker]:
        store = RepoStore(settings.data_dir / "repos")
        try:
            yield TaskWorker(db, msgspec.structs.replace(settings, **changes), store, EventBus(), LiveHub(), AllowAll())
        finally:
            await store.close()

    return make


async def start(client: AsyncTestClient[Litestar], world: World, **fields: Any) -> dict[str, Any]:
    body = {"goal": "g", "agent": "fixer", "command": "true", **fields}
    r = await client.post(TASKS, json=body, headers=world.h("ana"))
    assert r.status_code == 201, r.text
    return dict(r.json())


async def test_a_run_goes_only_to_a_worker_with_its_labels(
    client: AsyncTestClient[Litestar], world: World, worker_with: Callable[..., Any]
) -> None:
    task = await start(client, world, worker_labels=["gpu"])
    assert task["required_labels"] == ["gpu"] and task["waiting_for_labels"] == ["gpu"]
    async with worker_with() as plain, worker_with(worker_labels="large") as large:
        assert await plain._claim(4) == [] and await large._claim(4) == []
    assert (await client.get(f"{TASKS}/1", headers=world.h("ana"))).json()["state"] == "queued"
    async with worker_with(worker_labels="gpu,large") as gpu:
        assert len(await gpu._claim(4)) == 1
    task = (await client.get(f"{TASKS}/1", headers=world.h("ana"))).json()
    assert task["state"] == "running" and task["runs"][0]["worker"] == gpu.id
    # Claimed: it waits for nothing now; what it required stays on the task.
    assert task["waiting_for_labels"] == [] and task["required_labels"] == ["gpu"]


async def test_a_task_without_labels_goes_to_any_worker(
    client: AsyncTestClient[Litestar], world: World, worker_with: Callable[..., Any]
) -> None:
    task = await start(client, world)
    assert task["required_labels"] == [] and task["waiting_for_labels"] == []
    async with worker_with(worker_labels="gpu") as gpu:
        assert len(await gpu._claim(4)) == 1


async def test_the_repository_and_the_task_labels_are_both_required(
    client: AsyncTestClient[Litestar], world: World, worker_with: Callable[..., Any]
) -> None:
    r = await client.put(SETTINGS, json={"worker_labels": ["gpu", "gpu"]}, headers=world.h("ana"))
    assert r.status_code == 200 and r.json()["worker_labels"] == ["gpu"], r.text
    assert (await client.get(SETTINGS, headers=world.h("ana"))).json()["worker_labels"] == ["gpu"]
    task = await start(client, world, worker_labels=["large"])
    assert task["waiting_for_labels"] == ["gpu", "large"]
    async with worker_with(worker_labels="gpu") as gpu, worker_with(worker_labels="large") as large:
        assert await gpu._claim(4) == [] and await large._claim(4) == []
    async with worker_with(worker_labels="large,gpu,ssd") as both:
        assert len(await both._claim(4)) == 1
    # A task started later without labels of its own still needs the repository's.
    await start(client, world)
    async with worker_with() as plain:
        assert await plain._claim(4) == []
    # Cleared (a PUT without the field): the tasks started from now on need none; started ones keep theirs.
    r = await client.put(SETTINGS, json={}, headers=world.h("ana"))
    assert r.status_code == 200 and r.json()["worker_labels"] is None
    await start(client, world)
    async with worker_with(task_repo_concurrency=5) as plain:
        assert len(await plain._claim(4)) == 1
    assert (await client.get(f"{TASKS}/3", headers=world.h("ana"))).json()["state"] == "running"
    queued = (await client.get(f"{TASKS}/2", headers=world.h("ana"))).json()
    assert queued["state"] == "queued" and queued["waiting_for_labels"] == ["gpu"]


@pytest.mark.parametrize(
    "labels",
    [["GPU"], ["gpu large"], [""], ["-gpu"], ["a" * 33], ["gpu/1"], [f"l{i}" for i in range(9)]],
)
async def test_bad_labels_are_refused_with_a_code(
    client: AsyncTestClient[Litestar], world: World, labels: list[str]
) -> None:
    body = {"goal": "g", "agent": "fixer", "command": "true", "worker_labels": labels}
    r = await client.post(TASKS, json=body, headers=world.h("ana"))
    assert r.status_code == 422 and r.json()["code"] == "invalid_worker_labels", r.text
    assert "a-z, 0-9" in r.json()["detail"]  # the message says what a label may be
    r = await client.put(SETTINGS, json={"worker_labels": labels}, headers=world.h("ana"))
    assert r.status_code == 422 and r.json()["code"] == "invalid_worker_labels", r.text
    assert (await client.get(TASKS, headers=world.h("ana"))).json() == []


async def test_more_than_eight_labels_together_are_refused(client: AsyncTestClient[Litestar], world: World) -> None:
    r = await client.put(SETTINGS, json={"worker_labels": [f"r{i}" for i in range(5)]}, headers=world.h("ana"))
    assert r.status_code == 200, r.text
    body = {"goal": "g", "agent": "fixer", "command": "true", "worker_labels": [f"t{i}" for i in range(4)]}
    r = await client.post(TASKS, json=body, headers=world.h("ana"))
    assert r.status_code == 422 and r.json()["code"] == "invalid_worker_labels", r.text
    await start(client, world, worker_labels=["r0", "t1", "t2", "t3"])  # 8 in all


async def test_capacity_bounds_the_runs_one_worker_claims(
    client: AsyncTestClient[Litestar], world: World, worker_with: Callable[..., Any]
) -> None:
    for _ in range(3):
        await start(client, world)
    async with worker_with(worker_capacity=2, task_concurrency=8, task_repo_concurrency=8) as worker:
        assert worker.capacity == 2
        spawned: list[int] = []
        never = asyncio.get_running_loop().create_future()

        def spawn(run_id: int, task_id: int) -> None:  # stands in for starting the run
            spawned.append(run_id)
            worker._running[run_id] = never  # type: ignore[assignment]

        worker._spawn = spawn  # type: ignore[method-assign]
        assert await worker.claim_once() == 2 and len(spawned) == 2
        assert await worker.claim_once() == 0  # full: the third stays queued
        worker._running.pop(spawned[0])  # one run ended
        assert await worker.claim_once() == 1
        never.cancel()
    states = [t["state"] for t in (await client.get(TASKS, headers=world.h("ana"))).json()]
    assert sorted(states) == ["running"] * 3


async def test_capacity_defaults_to_task_concurrency(worker_with: Callable[..., Any]) -> None:
    async with worker_with(task_concurrency=3) as worker:
        assert worker.capacity == 3 and worker.labels == frozenset()


async def test_the_page_says_which_labels_a_queued_task_waits_for(
    client: AsyncTestClient[Litestar], world: World
) -> None:
    await start(client, world, worker_labels=["large", "gpu"])
    page = (await client.get("/ana/demo/tasks/1", headers=world.h("ana"))).text
    assert "Waiting for a worker with labels gpu, large (#1 in the queue)." in page


async def test_two_workers_claiming_at_once_take_different_runs(
    client: AsyncTestClient[Litestar], world: World, worker_with: Callable[..., Any], db: Database
) -> None:
    """A worker locks only the runs it has room for: on PostgreSQL another claiming while its claim
    is open takes the next ones at once (it used to lock up to 100, so the other found every queued
    run locked). SQLite has one writer: the other's claim waits for the first to commit, then takes
    the next ones too."""
    postgres = db.engine.dialect.name == "postgresql"
    for _ in range(4):
        await start(client, world)
    async with worker_with(task_repo_concurrency=8) as a, worker_with(task_repo_concurrency=8) as b:
        inside, go_on = asyncio.Event(), asyncio.Event()

        class Held(RunEnv):  # a's claim pauses inside its transaction, its rows locked
            def lifecycle(self, session: AsyncSession) -> Lifecycle:
                life = super().lifecycle(session)
                publish = life.publish

                async def paused(*args: Any, **kw: Any) -> None:
                    inside.set()
                    await go_on.wait()
                    await publish(*args, **kw)

                life.publish = paused  # type: ignore[method-assign]
                return life

        a.env = Held(**{f.name: getattr(a.env, f.name) for f in dataclasses.fields(a.env)})
        first = asyncio.create_task(a._claim(1))
        await asyncio.wait_for(inside.wait(), 30)
        other = asyncio.create_task(b._claim(2))
        if postgres:  # done while a's claim still holds its rows
            await asyncio.wait_for(asyncio.shield(other), 30)
        go_on.set()
        [(a_run, _)] = await asyncio.wait_for(first, 30)
        second = await asyncio.wait_for(other, 30)
    assert len(second) == 2 and a_run not in [run for run, _ in second]
    listed = (await client.get(TASKS, headers=world.h("ana"))).json()
    assert sorted(t["state"] for t in listed) == ["queued", "running", "running", "running"]


async def test_a_claim_that_passed_over_what_it_read_looks_again(
    client: AsyncTestClient[Litestar], world: World, worker_with: Callable[..., Any], db: Database
) -> None:
    """Reading only what it has room for, a worker that had to pass a run over (its task no longer
    queued) wakes itself to look again at once, rather than wait for the next notice."""
    await start(client, world)
    await start(client, world)
    async with db.session(write=True) as s:  # the first task left the queue while its run was still queued
        await s.execute(update(Task).where(Task.number == 1).values(state=TaskState.STOPPED))
    async with worker_with() as worker:
        assert not worker.woken
        assert await worker._claim(1) == []  # it read the first run only, and passed it over
        assert worker.woken
        assert len(await worker._claim(1)) == 1
    listed = {t["number"]: t["state"] for t in (await client.get(TASKS, headers=world.h("ana"))).json()}
    assert listed == {1: "stopped", 2: "running"}
