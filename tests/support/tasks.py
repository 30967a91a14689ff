"""A task world against a real server: seed a user, a bot with write access and a repository,
serve the app on 127.0.0.1 (with its worker), and read tasks and transcripts over HTTP."""

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import docker
import httpx
import msgspec
import pygit2

from forge.accounts import accounts, tokens
from forge.core.settings import Settings
from forge.db.audit import Actor
from forge.db.engine import Database
from forge.db.events import EventBus
from forge.git import Identity, RepoStore
from forge.git.bare import write_commit
from forge.repos import collaborators, lifecycle, repositories
from tests.support.ports import free_port
from tests.support.waiting import until, until_sync

SECRET = "sk-live-0123456789abcdefXYZ"
SYSTEM = Actor.system("test")


class Env(msgspec.Struct):
    url: str
    settings: Settings
    token: str
    repo_path: Path

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=self.url, headers={"Authorization": f"Bearer {self.token}"}, timeout=httpx.Timeout(120)
        )


async def seed(settings: Settings) -> tuple[str, Path]:
    db = Database(settings.effective_database_url)
    store = RepoStore(settings.data_dir / "repos")
    try:
        async with db.session(write=True) as s:
            ana = await accounts.create_user(s, SYSTEM, "ana", "correct horse battery")
            await accounts.create_bot(s, SYSTEM, "fixer")
            repo = await lifecycle.create(s, store, EventBus(), SYSTEM, ana, "demo", auto_init=True)
            res = await repositories.resource_for(s, repo, SYSTEM.principal)
            await collaborators.set_collaborator(s, SYSTEM, res, "fixer", "write")
            created = await tokens.create(s, SYSTEM, ana, "t", ["repo:write", "tasks:write", "reviews:write"], None)
        await store.write(
            ("ana", "demo"),
            write_commit,
            branch="main",
            files={"old.txt": b"old\n", "lib/keep.py": b"print('keep')\n", "run.sh": b"#!/bin/sh\necho hi\n"},
            modes={"run.sh": 0o100755},
            message="seed",
            author=Identity(name="ana", email="ana@example.com"),
        )
        return created.token, store.path(("ana", "demo"))
    finally:
        await store.close()
        await db.dispose()


def serve(settings: Settings, on_app: Callable[[Any], None] | None = None) -> Iterator[str]:
    import threading

    import uvicorn

    from forge.app.factory import create_app

    port = free_port()
    served = msgspec.structs.replace(settings, host="127.0.0.1", port=port, base_url=f"http://127.0.0.1:{port}")
    app = create_app(served)
    if on_app is not None:
        on_app(app)  # e.g. a bench that needs the app's live hub
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    until_sync(lambda: server.started or not thread.is_alive(), timeout=30, what="the server to start")
    assert server.started, "the server did not start"
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=90)


def serve_env(settings: Settings) -> Iterator[Env]:
    """The seeded world (`seed`) served with the worker on (`task_settings`): a docker test's `env`."""
    s = task_settings(settings)
    token, path = asyncio.run(seed(s))
    for url in serve(s):
        yield Env(url=url, settings=s, token=token, repo_path=path)


@contextlib.asynccontextmanager
async def served(settings: Settings, **kw: Any) -> AsyncIterator[tuple[Env, httpx.AsyncClient]]:
    """The seeded world served with its worker (`task_settings(settings, **kw)`), and a client of ana's."""
    s = task_settings(settings, **kw)
    token, path = await asyncio.to_thread(lambda: asyncio.run(seed(s)))
    for url in serve(s):
        env = Env(url=url, settings=s, token=token, repo_path=path)
        async with env.client() as c:
            yield env, c


def task_settings(settings: Settings, **kw: Any) -> Settings:
    # Repository and personal model endpoints in tests are scripted servers on 127.0.0.1.
    base: dict[str, Any] = {
        "run_worker": True,
        "model_api_key": SECRET,
        "task_wall_clock_seconds": 600,
        "model_allowed_hosts": "127.0.0.1",
    }
    base.update(kw)
    return msgspec.structs.replace(settings, **base)


async def start(c: httpx.AsyncClient, command: Any, **kw: Any) -> dict[str, Any]:
    r = await c.post("/api/v1/repos/ana/demo/tasks", json={"goal": "do it", "agent": "fixer", "command": command, **kw})
    assert r.status_code == 201, r.text
    body: dict[str, Any] = r.json()
    return body


async def wait_task(
    c: httpx.AsyncClient, number: int, check: Callable[[dict[str, Any]], object], *, what: str, timeout: float = 120
) -> dict[str, Any]:
    """Task `number` (ana/demo) once `check` holds for it (`check` may fail at once on a state
    that rules the wanted one out); fails naming `what` and the task last seen."""
    last: dict[str, Any] = {}

    async def look() -> dict[str, Any] | None:
        nonlocal last
        r = await c.get(f"/api/v1/repos/ana/demo/tasks/{number}")
        last = r.json()
        return last if check(last) else None

    task = await until(look, timeout=timeout, what=what, show=lambda: last)
    assert task is not None
    return task


async def wait_state(c: httpx.AsyncClient, number: int, *states: str, timeout: float = 120) -> dict[str, Any]:
    return await wait_task(
        c, number, lambda t: t["state"] in states, what=f"task {number} to be {' or '.join(states)}", timeout=timeout
    )


async def all_events(c: httpx.AsyncClient, number: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    after = 0
    while True:
        r = await c.get(f"/api/v1/repos/ana/demo/tasks/{number}/transcript", params={"after": after, "limit": 1000})
        page = r.json()
        out += page["events"]
        after = page["next_after"]
        if not page["events"]:
            return out


def output_text(events: list[dict[str, Any]], kind: str = "stdout") -> str:
    return "".join(e["payload"]["text"] for e in events if e["kind"] == kind)


def tree_files(repo_path: Path, sha: str) -> dict[str, tuple[int, bytes]]:
    repo = pygit2.Repository(str(repo_path))
    out: dict[str, tuple[int, bytes]] = {}

    def walk(tree: pygit2.Tree, prefix: str) -> None:
        for entry in tree:
            obj = repo[entry.id]
            if entry.filemode == pygit2.enums.FileMode.TREE:
                walk(obj, f"{prefix}{entry.name}/")
            else:
                out[f"{prefix}{entry.name}"] = (entry.filemode, obj.data)

    walk(repo[sha].peel(pygit2.Commit).tree, "")
    return out


def containers_of(settings: Settings) -> list[Any]:
    client = docker.from_env()
    try:
        return list(client.containers.list(all=True, filters={"label": f"forgehand.instance={settings.instance_id}"}))
    finally:
        client.close()


async def start_task(settings: Settings, db: Database, goal: str = "g") -> tuple[int, int, int]:
    """A `command` task started by ana in the seeded repository (`seed`), straight through the
    service (no worker runs it): its id, number and its first run's id."""
    from sqlalchemy import select

    from forge.core.access import Principal
    from tasks.core.models import Run
    from tasks.core.policy import AllowAll
    from tasks.core.schemas import TaskCreate
    from tasks.services.tasks import TaskService

    store = RepoStore(settings.data_dir / "repos")
    try:
        async with db.session(write=True) as s:
            ana = await accounts.require_by_login(s, "ana")
            actor = Actor(principal=Principal(account_id=ana.id, login="ana", type="User", via="token"))
            res = await repositories.load(s, actor.principal, "ana", "demo")
            svc = TaskService(s, bus=EventBus(), store=store, settings=settings, gate=AllowAll())
            task = await svc.start(actor, res, TaskCreate(goal=goal, agent="fixer", command="true"))
            run = (await s.execute(select(Run).where(Run.task_id == task.id))).scalar_one()
            return task.id, task.number, run.id
    finally:
        await store.close()
