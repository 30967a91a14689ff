"""Recovery of an interrupted run whose workspace holds a name that is not UTF-8 (what an agent
gets with `touch $'bad\\xffname'`): the run ends `interrupted`, the name is listed escaped, the
workspace goes; and when its reports cannot be written, the run still ends, without them. A run's
`worker` is null while it is queued, then the id of the worker that claimed it, run ended or not."""

import os
from pathlib import Path

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy import select

from forge.core.settings import Settings
from forge.db.engine import Database
from forge.db.events import EventBus
from forge.git import RepoStore
from forge.git import snapshot as snapshot_module
from tasks.core.live import LiveHub
from tasks.core.models import Run, Task
from tasks.core.policy import AllowAll
from tasks.core.states import RunState, TaskState
from tasks.run.worker import TaskWorker
from tests.support.task_world import BASE_FILES, TASKS, World, build_task_world

pytestmark = pytest.mark.db


@pytest.fixture
async def world(db: Database, settings: Settings) -> World:
    return await build_task_world(db, settings)


async def interrupted_run(client: AsyncTestClient[Litestar], world: World, db: Database, settings: Settings) -> Path:
    """A task whose run was running on a worker that is gone, its workspace left on disk."""
    r = await client.post(TASKS, json={"goal": "g", "agent": "fixer", "command": "true"}, headers=world.h("ana"))
    assert r.status_code == 201, r.text
    assert r.json()["runs"][0]["worker"] is None  # queued: no worker yet
    async with db.session(write=True) as s:
        task = (await s.execute(select(Task))).scalar_one()
        run = (await s.execute(select(Run))).scalar_one()
        task.state = TaskState.RUNNING
        run.state, run.owner, run.heartbeat_at, run.start_sha = RunState.RUNNING, "gone:1:x", None, task.base_sha
        workspace = settings.data_dir.resolve() / "workspaces" / task.uuid / run.uuid
    workspace.mkdir(parents=True)
    for name, data in BASE_FILES.items():
        (workspace / name).write_bytes(data)
    (workspace / "good.txt").write_text("ok\n")
    with open(os.fsencode(workspace) + b"/bad\xffname", "wb") as fh:
        fh.write(b"x\n")
    return workspace


async def recover(db: Database, settings: Settings) -> None:
    store = RepoStore(settings.data_dir / "repos")
    worker = TaskWorker(db, settings, store, EventBus(), LiveHub(), AllowAll())
    try:
        await worker.recover(reap_containers=False)
    finally:
        await store.close()


async def test_a_run_names_the_worker_that_claimed_it(
    client: AsyncTestClient[Litestar], world: World, db: Database, settings: Settings
) -> None:
    r = await client.post(TASKS, json={"goal": "g", "agent": "fixer", "command": "true"}, headers=world.h("ana"))
    assert r.status_code == 201, r.text
    [queued] = (await client.get(f"{TASKS}/1", headers=world.h("ana"))).json()["runs"]
    assert queued["state"] == "queued" and queued["worker"] is None
    store = RepoStore(settings.data_dir / "repos")
    worker = TaskWorker(db, settings, store, EventBus(), LiveHub(), AllowAll())
    try:
        assert len(await worker._claim(1)) == 1  # the claim alone: no run is started
    finally:
        await store.close()
    task = (await client.get(f"{TASKS}/1", headers=world.h("ana"))).json()
    [listed] = (await client.get(TASKS, headers=world.h("ana"))).json()
    for run in (task["runs"][0], listed["runs"][0]):
        assert run["state"] == "running" and run["worker"] == worker.id, run


async def test_recovery_lists_a_name_that_is_not_utf8_escaped(
    client: AsyncTestClient[Litestar], world: World, db: Database, settings: Settings
) -> None:
    workspace = await interrupted_run(client, world, db, settings)
    await recover(db, settings)
    task = (await client.get(f"{TASKS}/1", headers=world.h("ana"))).json()
    assert task["state"] == "failed" and task["failure_reason"] == "interrupted", task
    assert task["runs"][0]["worker"] == "gone:1:x"  # the worker that had it, though gone
    assert task["runs"][0]["skipped"] == [{"path": "bad\\xffname", "reason": "the file name is not valid UTF-8"}]
    assert task["head_is_wip"] and not workspace.exists()


async def test_recovery_ends_the_run_even_when_its_reports_cannot_be_written(
    client: AsyncTestClient[Litestar],
    world: World,
    db: Database,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As before the escaping: the report holds the raw name, which no encoder takes. Recovery used
    to fail the same way on every start; now the run ends, its lists left out, the reason told."""
    monkeypatch.setattr(snapshot_module, "shown", lambda path: path)
    workspace = await interrupted_run(client, world, db, settings)
    await recover(db, settings)
    task = (await client.get(f"{TASKS}/1", headers=world.h("ana"))).json()
    assert task["state"] == "failed" and task["failure_reason"] == "interrupted", task
    assert task["runs"][0]["skipped"] == [] and task["head_is_wip"] and not workspace.exists()
    events = (await client.get(f"{TASKS}/1/transcript", headers=world.h("ana"))).json()
    texts = [e["payload"].get("text", "") for e in events["events"]]
    assert any("reports could not be recorded: " in t for t in texts), texts
