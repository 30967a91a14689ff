"""What the layering of tasks promises: wake-ups follow the commit of the unit of work (not a
handler's call), and a page of tasks costs the same number of queries whatever its size."""

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy import event, select

from forge.accounts import accounts
from forge.core.access import Principal
from forge.core.settings import Settings
from forge.db.audit import Actor
from forge.db.engine import Database, after_commit, utcnow
from forge.db.events import EventBus
from forge.git import RepoStore
from forge.repos import repositories
from sandbox import SandboxEngine
from tasks.core.live import LiveHub
from tasks.core.models import Approval, Run, Task
from tasks.core.schemas import TaskCreate
from tasks.core.states import ApprovalState, RunState, TaskState
from tasks.system import TaskSystem
from tests.support.task_world import TASKS, World, build_task_world

pytestmark = pytest.mark.db


@pytest.fixture
async def world(db: Database, settings: Settings) -> World:
    return await build_task_world(db, settings)


async def ana(db: Database) -> Actor:
    async with db.session() as s:
        account = await accounts.require_by_login(s, "ana")
        return Actor(principal=Principal(account_id=account.id, login="ana", type="User", via="token"))


async def test_after_commit_runs_once_per_key_after_the_commit_and_never_on_rollback(db: Database) -> None:
    calls: list[str] = []
    async with db.session() as s:
        after_commit(s, "a", lambda: calls.append("a"))
        after_commit(s, "a", lambda: calls.append("a again"))  # same key, same transaction: once
        after_commit(s, "b", lambda: calls.append("b"))
        await s.execute(select(1))
        assert calls == []
    assert calls == ["a", "b"]
    with pytest.raises(RuntimeError):
        async with db.session() as s:
            after_commit(s, "c", lambda: calls.append("c"))
            raise RuntimeError("rolled back")
    assert calls == ["a", "b"]

    def broken() -> None:
        raise ValueError("a hook failed")

    async with db.session() as s:  # a failing hook neither undoes the commit nor stops the others
        after_commit(s, "x", broken)
        after_commit(s, "y", lambda: calls.append("y"))
    assert calls == ["a", "b", "y"]


async def test_a_start_through_the_service_wakes_the_worker_after_the_commit(
    db: Database, settings: Settings, world: World
) -> None:
    store = RepoStore(settings.data_dir / "repos")
    hub = LiveHub()
    changed: list[int] = []
    hub.listen(changed.append)
    system = TaskSystem(db, settings, store, EventBus(), hub=hub)
    worker = system.make_worker(engine=SandboxEngine())
    hub.listen(worker.on_task_changed)  # what `TaskWorker.start` does
    actor = await ana(db)
    create = TaskCreate(goal="wake up", agent="fixer", command="true")
    try:
        async with db.session(write=True) as s:
            res = await repositories.load(s, actor.principal, "ana", "demo")
            task = await system.service(s).start(actor, res, create)
            await s.flush()
            assert not worker.woken and changed == []  # not before the commit
        assert worker.woken and changed == [task.id]  # once, after it
        hub.unlisten(worker.on_task_changed)
        worker = system.make_worker(engine=SandboxEngine())
        hub.listen(worker.on_task_changed)
        with pytest.raises(RuntimeError):
            async with db.session(write=True) as s:
                res = await repositories.load(s, actor.principal, "ana", "demo")
                await system.service(s).start(actor, res, create)
                raise RuntimeError("the handler failed after the start")
        assert not worker.woken and changed == [task.id]  # a rollback wakes nobody
        async with db.session() as s:
            assert len((await s.execute(select(Task))).scalars().all()) == 1
    finally:
        await store.close()


@contextmanager
def counting(app: Litestar) -> Iterator[list[str]]:
    statements: list[str] = []
    engine = app.state.db.engine.sync_engine

    def count(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        statements.append(statement)

    event.listen(engine, "before_cursor_execute", count)
    try:
        yield statements
    finally:
        event.remove(engine, "before_cursor_execute", count)


async def add_tasks(db: Database, settings: Settings, n: int) -> None:
    """`n` tasks in every shape the read model joins: queued ones (a queue position), a blocked one
    with a pending approval, a merged one (a merger), runs of several kinds."""
    store = RepoStore(settings.data_dir / "repos")
    system = TaskSystem(db, settings, store, EventBus())
    actor = await ana(db)
    try:
        for i in range(n):
            async with system.new(write=True) as svc:
                s = svc.session
                res = await repositories.load(s, actor.principal, "ana", "demo")
                task = await svc.start(actor, res, TaskCreate(goal=f"t{i}", agent="fixer", command="true"))
                run = (await s.execute(select(Run).where(Run.task_id == task.id))).scalar_one()
                if i % 3 == 1:
                    run.state = RunState.BLOCKED
                    task.state = TaskState.BLOCKED
                    s.add(
                        Approval(
                            task_id=task.id,
                            repo_id=task.repo_id,
                            run_id=run.id,
                            tool_use_id=f"c{i}",
                            tool_name="bash",
                            tool_input={"command": "ls"},
                            input_hash="0" * 64,
                            state=ApprovalState.PENDING,
                            expires_at=utcnow(),
                        )
                    )
                elif i % 3 == 2:
                    run.state = RunState.SUCCEEDED
                    task.state = TaskState.MERGED
                    task.merged_by_id = actor.principal.account_id
                    task.merged_at = utcnow()
    finally:
        await store.close()


async def queries_for(client: AsyncTestClient[Litestar], app: Litestar, path: str, headers: dict[str, str]) -> int:
    assert (await client.get(path, headers=headers)).status_code == 200  # warm (token cache, ...)
    with counting(app) as statements:
        r = await client.get(path, headers=headers)
    assert r.status_code == 200
    return len(statements)


async def test_a_page_of_tasks_costs_the_same_queries_for_1_or_50_tasks(
    client: AsyncTestClient[Litestar], app: Litestar, db: Database, settings: Settings, world: World
) -> None:
    pages = [TASKS, "/api/v1/user/tasks", "/ana/demo/tasks"]
    h = world.h("ana")
    await add_tasks(db, settings, 1)
    one = {p: await queries_for(client, app, p, h) for p in pages}
    await add_tasks(db, settings, 49)
    listed = (await client.get(TASKS, headers=h)).json()
    assert len(listed) == 50 and {t["state"] for t in listed} == {"queued", "blocked", "merged"}
    assert any(t["pending_approval"] for t in listed) and any(t["merged_by"] == "ana" for t in listed)
    fifty = {p: await queries_for(client, app, p, h) for p in pages}
    assert fifty == one, (one, fifty)
