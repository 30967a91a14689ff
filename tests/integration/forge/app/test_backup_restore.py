"""`forgehand backup` and `forgehand restore` (forge/app/commands/backup.py) on a real instance:
an instance with a repository, tasks, a transcript and a sealed secret is backed up through the
CLI while its app is up, restored into a fresh data directory and a fresh database, and the
restored instance, served by the real app, holds the same repositories, tasks, transcript and
secret. On SQLite, and on PostgreSQL when the suite runs on it (tests/conftest.py `db_url`)."""

import asyncio
import json
import os
import subprocess
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pygit2
import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy import select, text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine

from forge.app.factory import create_app
from forge.core.settings import Settings, load_settings, prepare_data_dir
from forge.db.engine import Database
from forge.db.migrate import head_revision
from forge.repos.repo_secrets import RepoSecrets, secret_box
from tasks.core import transcript
from tasks.core.models import Task
from tasks.core.transcript import Notice, Output, Pending
from tests.support.cli import forgehand, instance_env
from tests.support.databases import worker_name
from tests.support.task_world import TASKS, World, agent_commits, build_task_world

REPO = "/api/v1/repos/ana/demo"
SECRET_VALUE = "deploy-key-0123456789"


async def _admin(admin_url: str, statement: str) -> None:
    engine = create_async_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        async with engine.connect() as conn:
            await conn.execute(text(statement))
    finally:
        await engine.dispose()


@pytest.fixture
async def restore_db_url(db_url: str, tmp_path: Path) -> AsyncIterator[str]:
    """Where the restore puts the database: SQLite, the new data dir's default file (the URL
    stays empty); PostgreSQL, a new, empty database (its name under this worker's prefix, which
    tests/support/databases.py sweeps if this test cannot drop it)."""
    if not db_url.startswith("postgresql"):
        yield ""
        return
    admin = os.environ["FORGEHAND_TEST_DATABASE_URL"]
    name = f"{make_url(admin).database}_{worker_name()}_restore_{uuid.uuid4().hex[:8]}"
    await _admin(admin, f'CREATE DATABASE "{name}"')
    yield make_url(admin).set(database=name).render_as_string(hide_password=False)
    await _admin(admin, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def _build_instance(client: AsyncTestClient[Litestar], db: Database, settings: Settings) -> World:
    """ana/demo with a base commit; task 1 in review with an agent's commit and a transcript,
    task 2 queued; a repository secret sealed with the instance's key."""
    world = await build_task_world(db, settings)
    for goal in ("add a file", "second thing"):
        r = await client.post(TASKS, json={"goal": goal, "agent": "fixer", "command": "true"}, headers=world.h("ana"))
        assert r.status_code == 201, r.text
    await agent_commits(db, settings, 1, {"new.txt": b"new\n"}, "agent work")
    async with db.session(write=True) as s:
        task_id = (await s.execute(select(Task.id).where(Task.number == 1))).scalar_one()
        await transcript.append(
            s,
            task_id,
            [
                Pending(kind="notice", payload=Notice(text="starting")),
                Pending(kind="stdout", payload=Output(text="hello from the sandbox\n")),
                Pending(kind="notice", payload=Notice(text="done")),
            ],
        )
    r = await client.put(f"{REPO}/actions/secrets/DEPLOY_KEY", json={"value": SECRET_VALUE}, headers=world.h("ana"))
    assert r.status_code == 201, r.text
    return world


async def _observe(client: AsyncTestClient[Litestar], world: World) -> dict[str, object]:
    """What the instance serves: branches and log, tasks (numbers, states, heads), transcript."""
    h = world.h("ana")
    branches = (await client.get(f"{REPO}/branches", headers=h)).json()
    log = (await client.get(f"{REPO}/commits", params={"sha": "main"}, headers=h)).json()
    tasks = (await client.get(TASKS, headers=h)).json()
    items = tasks["items"] if isinstance(tasks, dict) else tasks
    events = (await client.get(f"{TASKS}/1/transcript", headers=h)).json()["events"]
    return {
        "branches": sorted((b["name"], b["sha"]) for b in branches),
        "log": log,
        "tasks": sorted((t["number"], t["state"], t.get("head_sha")) for t in items),
        "transcript": [(e["seq"], e["kind"], e["payload"]) for e in events],
    }


def _restored_settings(data_dir: Path, database_url: str) -> Settings:
    return prepare_data_dir(
        load_settings(
            environ={},
            data_dir=data_dir,
            database_url=database_url,
            base_url="http://testserver.local",
            log_level="warning",
            run_worker=False,
            seed_demo=False,
        )
    )


async def test_backup_then_restore_serves_the_same_instance(
    client: AsyncTestClient[Litestar],
    db: Database,
    settings: Settings,
    db_url: str,
    restore_db_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tools: list[tuple[list[str], dict[str, str]]] = []
    real_run = subprocess.run

    def spy(argv: Any, *args: Any, **kw: Any) -> Any:
        if isinstance(argv, list) and Path(str(argv[0])).name in {"pg_dump", "pg_restore"}:
            tools.append((argv, kw["env"]))
        return real_run(argv, *args, **kw)

    monkeypatch.setattr(subprocess, "run", spy)
    world = await _build_instance(client, db, settings)
    before = await _observe(client, world)
    assert [e[1] for e in before["transcript"]] == ["prompt", "notice", "stdout", "notice"]  # type: ignore[attr-defined]
    assert [t[:2] for t in before["tasks"]] == [(1, "awaiting_review"), (2, "queued")]  # type: ignore[attr-defined]

    archive = tmp_path / "backup"
    ran = await asyncio.to_thread(forgehand, "backup", str(archive), env=instance_env(settings.data_dir, db_url))
    assert ran.returncode == 0, ran.stderr
    assert "Traceback" not in ran.stderr
    manifest = json.loads((archive / "manifest.json").read_text())
    assert manifest["alembic_revision"] == head_revision()
    assert manifest["database"] == ("postgresql" if db_url.startswith("postgresql") else "sqlite")
    assert manifest["counts"]["tasks"] == 2 and manifest["counts"]["transcript_events"] >= 3
    assert manifest["counts"]["bare_repositories"] == 1 and "secret_key" in manifest["instance_files"]
    assert "://" not in (archive / "manifest.json").read_text()  # no database URL, no credentials

    new_dir = tmp_path / "restored"
    env = {"FORGEHAND_DATABASE_URL": restore_db_url} if restore_db_url else {}
    ran = await asyncio.to_thread(forgehand, "restore", str(archive), "--data-dir", str(new_dir), env=env)
    assert ran.returncode == 0, ran.stderr
    if db_url.startswith("postgresql"):
        db_password = make_url(db_url).password
        assert [Path(argv[0]).name for argv, _ in tools] == ["pg_dump", "pg_restore"]
        for argv, tool_env in tools:  # the password in PGPASSWORD, never on a command line
            assert not any("://" in arg or f":{db_password}@" in arg or "password" in arg for arg in argv)
            assert tool_env["PGPASSWORD"] == db_password
    assert f"this forgehand's revision ({head_revision()})" in ran.stdout

    restored = _restored_settings(new_dir, restore_db_url)
    assert restored.secret_key == settings.secret_key and restored.instance_id == settings.instance_id
    async with AsyncTestClient(app=create_app(restored), base_url="http://testserver.local") as c:
        after = await _observe(c, world)  # the old tokens still sign in: hashed in the database
    assert after == before

    # The restored bare repository has the same heads, and every commit the database names.
    old = pygit2.Repository(str(settings.data_dir / "repos" / "ana" / "demo.git"))
    new = pygit2.Repository(str(new_dir / "repos" / "ana" / "demo.git"))
    assert {b: str(new.branches[b].target) for b in new.branches.local} == {
        b: str(old.branches[b].target) for b in old.branches.local
    }
    restored_db = Database(restored.effective_database_url)
    try:
        async with restored_db.session() as s:
            named = [sha for row in await s.execute(select(Task.base_sha, Task.head_sha)) for sha in row if sha]
            assert len(named) >= 3 and all(sha in new for sha in named)
            repo_id = (await s.execute(text("SELECT id FROM repositories"))).scalar_one()
            # Sealed with the instance key before the backup, opened with the restored one.
            assert await RepoSecrets(s, secret_box(restored)).values(repo_id, ["DEPLOY_KEY"]) == {
                "DEPLOY_KEY": SECRET_VALUE
            }
    finally:
        await restored_db.dispose()


async def test_restore_refuses_a_non_empty_data_dir_and_a_used_database(
    settings: Settings, db_url: str, tmp_path: Path
) -> None:
    archive = tmp_path / "backup"
    ran = await asyncio.to_thread(forgehand, "backup", str(archive), env=instance_env(settings.data_dir, db_url))
    assert ran.returncode == 0, ran.stderr

    # A second backup into the same place is refused: an archive is never overwritten.
    again = await asyncio.to_thread(forgehand, "backup", str(archive), env=instance_env(settings.data_dir, db_url))
    assert again.returncode == 2 and str(archive) in again.stderr and "Traceback" not in again.stderr

    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "something").write_text("keep me\n")
    ran = await asyncio.to_thread(forgehand, "restore", str(archive), "--data-dir", str(busy), env={})
    assert ran.returncode == 2, ran.stderr
    assert str(busy) in ran.stderr and "not empty" in ran.stderr and "Traceback" not in ran.stderr
    assert sorted(p.name for p in busy.iterdir()) == ["something"]

    # The database the backup came from has tables: restoring into it is refused too.
    if db_url.startswith("postgresql"):
        fresh = tmp_path / "fresh"
        env = {"FORGEHAND_DATABASE_URL": db_url}
        ran = await asyncio.to_thread(forgehand, "restore", str(archive), "--data-dir", str(fresh), env=env)
        assert ran.returncode == 2 and "already has" in ran.stderr and "--force" in ran.stderr
        assert not fresh.exists()

    # Not a backup at all.
    ran = await asyncio.to_thread(forgehand, "restore", str(busy), "--data-dir", str(tmp_path / "x"), env={})
    assert ran.returncode == 2 and "not a forgehand backup" in ran.stderr
