"""The workers' register and the lease: a worker whose Docker engine does not answer claims
nothing and says so (`/healthz`, the admin API and page); a run whose worker's lease lapsed (a host
gone silent) is taken over and ended `interrupted`, one within its lease is left alone; a worker
that lost a run's lease stops it instead of settling it. The claim and the recovery are driven
here: no sandbox is started."""

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

import msgspec
import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy import select, update

from forge.accounts import accounts, tokens
from forge.core.settings import Settings
from forge.db.engine import Database, utcnow
from forge.db.events import EventBus
from forge.db.models import Account
from forge.git import RepoStore
from sandbox import SandboxEngine
from tasks.core.live import LiveHub
from tasks.core.models import Run, Task
from tasks.core.policy import AllowAll
from tasks.core.states import RunState, TaskState
from tasks.core.worker_models import WorkerRecord
from tasks.run.worker import TaskWorker
from tests.support.task_world import SYSTEM, TASKS, World, build_task_world
from tests.support.web import sign_in

pytestmark = pytest.mark.db

NO_ENGINE = "unix:///nonexistent/forgehand-test/docker.sock"
LEASE = 3.0


@pytest.fixture
async def world(db: Database, settings: Settings) -> World:
    world = await build_task_world(db, settings)
    async with db.session(write=True) as s:
        await s.execute(update(Account).where(Account.login == "ana").values(is_admin=True))
        ana = await accounts.require_by_login(s, "ana")
        world.tokens["ana-admin"] = (await tokens.create(s, SYSTEM, ana, "admin", ["admin"], None)).token
    return world


@pytest.fixture
def worker_with(db: Database, settings: Settings) -> Callable[..., Any]:
    @asynccontextmanager
    async def make(*, engine: str = NO_ENGINE, started: bool = False) -> AsyncIterator[TaskWorker]:
        store = RepoStore(settings.data_dir / "repos")
        changed = msgspec.structs.replace(settings, worker_lease_seconds=LEASE)
        worker = TaskWorker(db, changed, store, EventBus(), LiveHub(), AllowAll(), engine=SandboxEngine(engine))
        try:
            if started:
                await worker.start()
            yield worker
        finally:
            if started:
                await worker.close()
            await worker.engine.close()
            await store.close()

    return make


async def start_task(client: AsyncTestClient[Litestar], world: World) -> None:
    r = await client.post(TASKS, json={"goal": "g", "agent": "fixer", "command": "true"}, headers=world.h("ana"))
    assert r.status_code == 201, r.text


async def test_a_worker_without_its_engine_claims_nothing_and_says_so(
    client: AsyncTestClient[Litestar], world: World, worker_with: Callable[..., Any]
) -> None:
    await start_task(client, world)
    async with worker_with(started=True) as worker:
        assert worker.engine_ok is False and "does not answer" in worker.engine_error
        assert await worker.claim_once() == 0
        assert (await client.get(f"{TASKS}/1", headers=world.h("ana"))).json()["state"] == "queued"
        await worker._beat()  # the register is written at once after a change of the engine's state

        health = await client.get("/healthz")
        assert health.status_code == 200  # the web replica still serves
        body = health.json()
        assert body["status"] == "degraded"
        assert body["workers"]["engine_unreachable"] == 1
        # Anyone may ask /healthz: which worker, its host and its engine are for admins only.
        assert worker.id not in health.text and NO_ENGINE not in health.text

        listed = (await client.get("/api/v1/admin/workers", headers=world.h("ana-admin"))).json()
        [row] = [w for w in listed if w["id"] == worker.id]
        assert row["state"] == "engine_unreachable" and row["engine"] == NO_ENGINE and row["capacity"] == 2
        assert "does not answer" in row["engine_error"]
        refused = await client.get("/api/v1/admin/workers", headers=world.h("wendy"))
        assert refused.status_code == 403, refused.text

    # Stopped cleanly: /healthz is ok again and the register says so.
    health = (await client.get("/healthz")).json()
    assert health["status"] == "ok" and health["workers"]["engine_unreachable"] == 0
    listed = (await client.get("/api/v1/admin/workers", headers=world.h("ana-admin"))).json()
    assert [w["state"] for w in listed if w["id"] == worker.id] == ["stopped"]


async def test_the_admin_workers_page_shows_a_worker_that_cannot_claim(
    client: AsyncTestClient[Litestar], world: World, worker_with: Callable[..., Any]
) -> None:
    async with worker_with(started=True) as worker:
        await worker._beat()
        signin = await sign_in(client, "ana", "correct horse battery")
        assert signin.status_code in (302, 303), signin.text
        page = await client.get("/admin/workers/")
        assert page.status_code == 200
        assert worker.id in page.text and "Engine unreachable: not claiming" in page.text
        assert NO_ENGINE in page.text


async def _running_elsewhere(db: Database, *, owner: str, host: str, silent_for: float) -> int:
    """The task's run made running on another host's worker, last heard `silent_for` seconds ago."""
    async with db.session(write=True) as s:
        task = (await s.execute(select(Task))).scalar_one()
        run = (await s.execute(select(Run))).scalar_one()
        beat = utcnow() - timedelta(seconds=silent_for)
        task.state = TaskState.RUNNING
        run.state, run.owner, run.heartbeat_at, run.start_sha = RunState.RUNNING, owner, beat, task.base_sha
        s.add(
            WorkerRecord(id=owner, host=host, pid=4242, engine="", labels=[], capacity=2, running=1, heartbeat_at=beat)
        )
        return run.id


async def test_a_lapsed_lease_is_taken_over_and_a_live_one_is_not(
    client: AsyncTestClient[Litestar], world: World, db: Database, worker_with: Callable[..., Any]
) -> None:
    await start_task(client, world)
    owner = "far-away-host:4242:abcd"
    await _running_elsewhere(db, owner=owner, host="far-away-host", silent_for=LEASE / 2)
    async with worker_with() as worker:
        await worker.recover(reap_containers=False)
        assert (await client.get(f"{TASKS}/1", headers=world.h("ana"))).json()["state"] == "running"
        async with db.session(write=True) as s:  # the lease lapses: no beat for longer than it
            silent = utcnow() - timedelta(seconds=120)  # past this worker's lease and the server's (30 s)
            await s.execute(update(Run).values(heartbeat_at=silent))
            await s.execute(update(WorkerRecord).values(heartbeat_at=silent))
        await worker.recover(reap_containers=False)
    task = (await client.get(f"{TASKS}/1", headers=world.h("ana"))).json()
    assert task["state"] == "failed" and task["failure_reason"] == "interrupted", task
    assert task["runs"][0]["worker"] == owner  # the run still names the worker that ran it
    listed = (await client.get("/api/v1/admin/workers", headers=world.h("ana-admin"))).json()
    assert [w["state"] for w in listed if w["id"] == owner] == ["lost"]


async def test_a_worker_that_lost_a_runs_lease_stops_it(
    client: AsyncTestClient[Litestar], world: World, db: Database, worker_with: Callable[..., Any]
) -> None:
    await start_task(client, world)
    async with worker_with() as worker:
        [(run_id, _task_id)] = await worker._claim(1)
        # Stands for the run going on here (the claim alone started nothing).
        worker._running[run_id] = asyncio.create_task(asyncio.Event().wait())
        try:
            assert await worker._beat() == []  # still its own
            async with db.session(write=True) as s:  # another worker took it over meanwhile
                await s.execute(update(Run).where(Run.id == run_id).values(owner="other:1:x", state=RunState.FAILED))
            assert await worker._beat() == [run_id]
        finally:
            worker._running.pop(run_id).cancel()


async def test_one_missed_ping_of_a_running_worker_is_not_enough_to_stop_claiming(
    worker_with: Callable[..., Any],
) -> None:
    async with worker_with() as worker:  # not started: it has not looked at its engine yet
        assert worker.engine_ok is True
        assert await worker.check_engine(confirm=True) is True  # one miss: a busy engine may miss one
        assert await worker.check_engine(confirm=True) is False  # two in a row: it stops claiming
        assert "does not answer" in worker.engine_error and await worker.claim_once() == 0
