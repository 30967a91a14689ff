"""`forgehand db copy --to postgresql+asyncpg://...` (forge/app/commands/db_copy.py), step 1 of
"Past one machine" in docs/operator.md: an instance built on SQLite at its default place
(`<data>/forgehand.db`) is copied through the CLI, with its app stopped, into a new PostgreSQL
database; the app started on that database and the same data directory serves the same accounts,
tokens (they still sign in), repository, tasks, transcript, issues and pull request, and new rows
are created after the copied ones (the sequences were set past them).

The source is always SQLite and the target always PostgreSQL, whatever database the suite runs on
(FORGEHAND_TEST_DATABASES): the test needs FORGEHAND_TEST_DATABASE_URL (`make test` and CI set it)
and fails, never skips, without it. Each target is a new, empty database of this worker
(tests/support/databases.py `postgres_empty`)."""

import asyncio
import os
import re
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from alembic.script import ScriptDirectory
from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy import JSON, Text, cast, select, text, type_coerce, update
from sqlalchemy.ext.asyncio import AsyncConnection, create_async_engine

from forge.accounts import accounts, tokens
from forge.app.commands.db_copy import model_tables
from forge.app.factory import create_app
from forge.core.settings import Settings, load_settings, prepare_data_dir
from forge.db.audit import Actor
from forge.db.engine import Database
from forge.db.migrate import alembic_config, head_revision, upgrade_async
from forge.db.models import Account
from tasks.core import transcript
from tasks.core.models import Task
from tasks.core.transcript import Notice, Output, Pending
from tests.support import databases
from tests.support.cli import Ran, forgehand
from tests.support.task_world import TASKS, World, agent_commits, build_task_world, open_task_pull
from webhooks.core.models import WebhookEndpoint, WebhookOutbox

pytestmark = pytest.mark.db

BASE = "http://testserver.local"
REPO = "/api/v1/repos/ana/demo"
SYSTEM = Actor.system("test")
# Bytes no text column could hold: NUL, bytes that are not UTF-8.
BODY = b"\x00\x01binary\xfe\xff\x00"


@pytest.fixture
def admin_url() -> str:
    url = os.environ.get("FORGEHAND_TEST_DATABASE_URL", "")
    if not url.startswith("postgresql"):
        pytest.fail(
            "db copy's target is PostgreSQL: set FORGEHAND_TEST_DATABASE_URL to a postgresql+asyncpg:// URL "
            "of a role that may create databases (`make test` provisions one)",
            pytrace=False,
        )
    return url


@pytest.fixture
async def target_url(admin_url: str) -> str:
    return await databases.postgres_empty(admin_url)


def _settings(data_dir: Path, database_url: str = "") -> Settings:
    return prepare_data_dir(
        load_settings(
            environ={},
            data_dir=data_dir,
            database_url=database_url,
            base_url=BASE,
            log_level="warning",
            run_worker=False,
            seed_demo=False,
        )
    )


@pytest.fixture
def source(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Settings:
    """An instance on SQLite at the default place (no FORGEHAND_DATABASE_URL), migrated."""
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    shutil.copyfile(databases.sqlite_template(tmp_path_factory.getbasetemp()), data_dir / "forgehand.db")
    return _settings(data_dir)


async def copy(data_dir: Path, target: str, *args: str, **env: str) -> Ran:
    """`forgehand db copy --to TARGET`, as an operator's shell runs it (FORGEHAND_DATA_DIR only)."""
    return await asyncio.to_thread(
        forgehand, "db", "copy", "--to", target, *args, env={"FORGEHAND_DATA_DIR": str(data_dir), **env}
    )


async def _build(client: AsyncTestClient[Litestar], db: Database, settings: Settings) -> tuple[World, dict[str, str]]:
    """ana/demo with tasks (one in review with a transcript and its pull request, one queued), an
    issue with a comment, an admin, a bot whose owner was created after it, a webhook outbox row
    with a binary body. Returns the world and the admin's token header."""
    world = await build_task_world(db, settings)
    for goal in ("add a file", "second thing"):
        r = await client.post(TASKS, json={"goal": goal, "agent": "fixer", "command": "true"}, headers=world.h("ana"))
        assert r.status_code == 201, r.text
    await agent_commits(db, settings, 1, {"new.txt": b"new\n"}, "agent work")
    await open_task_pull(db, settings, BASE, 1)
    r = await client.post(f"{REPO}/issues", json={"title": "Ünïcode ✓", "body": "a *body*"}, headers=world.h("ana"))
    assert r.status_code == 201, r.text
    r = await client.post(
        f"{REPO}/issues/{r.json()['number']}/comments", json={"body": "seen"}, headers=world.h("rita")
    )
    assert r.status_code == 201, r.text
    async with db.session(write=True) as s:
        task_id = (await s.execute(select(Task.id).where(Task.number == 1))).scalar_one()
        events = [
            Pending(kind="notice", payload=Notice(text="starting")),
            Pending(kind="stdout", payload=Output(text="hi\n")),
        ]
        await transcript.append(s, task_id, events)
        root = await accounts.create_user(s, SYSTEM, "root", "correct horse battery", is_admin=True)
        admin = (await tokens.create(s, SYSTEM, root, "t", ["admin"], None)).token
        bot = await accounts.create_bot(s, SYSTEM, "early-bot")
        zed = await accounts.create_user(s, SYSTEM, "zed", "correct horse battery")
        await s.execute(update(Account).where(Account.id == bot.id).values(owner_id=zed.id))
        endpoint = WebhookEndpoint(url="http://127.0.0.1:9/hook", kind="notify", secret_kid="k1", secret_enc="sealed")
        s.add(endpoint)
        await s.flush()
        s.add(WebhookOutbox(endpoint_id=endpoint.id, wid="w-1", event_type="ping", subject="demo", body=BODY))
    return world, {"Authorization": f"Bearer {admin}"}


async def _observe(client: AsyncTestClient[Litestar], world: World, admin: dict[str, str]) -> dict[str, Any]:
    """What the instance serves: who each token signs in as, the accounts (owners, flags), tasks,
    the first task's transcript, issues and comments, pull requests, branches."""
    h = world.h("ana")
    signed_in = {who: (await client.get("/api/v1/user", headers=world.h(who))).json()["login"] for who in world.tokens}
    listed = (await client.get("/api/v1/admin/accounts", headers=admin)).json()
    tasks = (await client.get(TASKS, headers=h)).json()
    items = tasks["items"] if isinstance(tasks, dict) else tasks
    events = (await client.get(f"{TASKS}/1/transcript", headers=h)).json()["events"]
    pulls = (await client.get(f"{REPO}/pulls", params={"state": "all"}, headers=h)).json()
    issues = (await client.get(f"{REPO}/issues", params={"state": "all"}, headers=h)).json()
    comments = (await client.get(f"{REPO}/issues/{issues[0]['number']}/comments", headers=h)).json()
    branches = (await client.get(f"{REPO}/branches", headers=h)).json()
    return {
        "signed_in": signed_in,
        "accounts": sorted(
            (a["id"], a["login"], a["type"], a["owner"], a["is_admin"], a["created_at"]) for a in listed
        ),
        "tasks": sorted((t["number"], t["state"], t.get("head_sha"), t["goal"]) for t in items),
        "transcript": [(e["seq"], e["kind"], e["payload"]) for e in events],
        "pulls": [(p["number"], p["title"], p["state"], p["head"]["sha"]) for p in pulls],
        "issues": [(i["number"], i["title"], i["body"], i["created_at"]) for i in issues],
        "comments": [(c["user"]["login"], c["body"]) for c in comments],
        "branches": sorted((b["name"], b["sha"]) for b in branches),
    }


async def _rows(conn: AsyncConnection, postgres: bool) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table, in primary key order; JSON columns as their stored text."""
    out = {}
    for table in model_tables():
        columns = [
            (cast(c, Text) if postgres else type_coerce(c, Text)) if isinstance(c.type, JSON) else c
            for c in table.columns
        ]
        rows = await conn.execute(select(*columns).order_by(*table.primary_key.columns))
        out[table.name] = [tuple(row) for row in rows]
    return out


async def _all_rows(url: str) -> dict[str, list[tuple[Any, ...]]]:
    db = Database(url)
    try:
        async with db.engine.connect() as conn:
            return await _rows(conn, url.startswith("postgresql"))
    finally:
        await db.dispose()


def _add_nul(database: Path) -> None:
    """A NUL at the end of the issue comment's body: SQLite stores it, PostgreSQL cannot."""
    conn = sqlite3.connect(database)
    try:
        conn.execute("UPDATE issue_comments SET body = body || char(0)")
        conn.commit()
    finally:
        conn.close()


def _without_nul(rows: dict[str, list[tuple[Any, ...]]]) -> dict[str, list[tuple[Any, ...]]]:
    def clean(value: Any) -> Any:
        return value.replace("\x00", "\ufffd") if isinstance(value, str) else value

    return {name: [tuple(clean(v) for v in row) for row in table] for name, table in rows.items()}


async def test_copy_moves_a_sqlite_instance_to_postgresql(source: Settings, target_url: str) -> None:
    db = Database(source.effective_database_url)
    try:
        async with AsyncTestClient(app=create_app(source), base_url=BASE) as client:
            world, admin = await _build(client, db, source)
            before = await _observe(client, world, admin)
    finally:
        await db.dispose()  # the server is stopped for the copy
    assert [t[:2] for t in before["tasks"]] == [(1, "awaiting_review"), (2, "queued")]
    assert [e[1] for e in before["transcript"]] == ["prompt", "notice", "stdout"]
    assert ("early-bot", "zed") in {(a[1], a[3]) for a in before["accounts"]}
    assert before["signed_in"] == {who: who.removesuffix("-tasks-only") for who in world.tokens}
    assert len(before["pulls"]) == 1 and len(before["issues"]) == 1 and before["comments"] == [("rita", "seen")]

    # A NUL in a text column is refused, naming the row and the fixes; nothing is copied.
    _add_nul(source.data_dir / "forgehand.db")
    refused = await copy(source.data_dir, target_url)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    assert "issue_comments.body of the row id = 1 holds a NUL character" in refused.stderr
    assert "nothing was copied" in refused.stderr and "--replace-nul" in refused.stderr

    # Into the same target (the refusal left it empty), the NUL written as U+FFFD.
    ran = await copy(source.data_dir, target_url, "--replace-nul")
    assert ran.returncode == 0, ran.stderr
    assert re.search(r"^  accounts +8$", ran.stdout, re.M), ran.stdout
    assert re.search(r"^  issue_comments +1  \(1 with NUL replaced\)$", ran.stdout, re.M), ran.stdout
    summary = re.search(r"copied ([\d,]+) rows in (\d+) tables in ([\d.]+) s", ran.stdout)
    assert summary is not None and summary.group(2) == str(len(model_tables())), ran.stdout
    assert "export FORGEHAND_DATABASE_URL=postgresql+asyncpg://" in ran.stdout and "forgehand serve" in ran.stdout
    assert "PASSWORD@" in ran.stdout and ":forgehand@" not in ran.stdout  # never the password
    print(f"db copy: {summary.group(1)} rows in {summary.group(3)} s")  # the figure, with -s

    # Every row, column for column: JSON as stored, datetimes, booleans, binary.
    copied = await _all_rows(target_url)
    assert copied == _without_nul(await _all_rows(source.effective_database_url))
    assert any(BODY in row for row in copied["webhook_outbox"])
    before["comments"] = [("rita", "seen\ufffd")]

    moved = _settings(source.data_dir, target_url)
    async with AsyncTestClient(app=create_app(moved), base_url=BASE) as c:
        assert await _observe(c, world, admin) == before
        r = await c.post(
            TASKS, json={"goal": "after the move", "agent": "fixer", "command": "true"}, headers=world.h("ana")
        )
        assert r.status_code == 201, r.text
        assert r.json()["number"] == 3
        r = await c.post(f"{REPO}/issues", json={"title": "new here"}, headers=world.h("wendy"))
        assert r.status_code == 201, r.text
        r = await c.post(
            "/api/v1/admin/users", json={"login": "newcomer", "password": "correct horse battery"}, headers=admin
        )
        assert r.status_code == 201, r.text
        events = (await c.get(f"{TASKS}/3/transcript", headers=world.h("ana"))).json()["events"]
        assert [e["kind"] for e in events][:1] == ["prompt"]

    again = await copy(source.data_dir, target_url)
    assert again.returncode == 2 and "Traceback" not in again.stderr, again.stderr
    assert "it is not empty, access_tokens, accounts," in again.stderr and "already hold rows" in again.stderr
    assert "new, empty database" in again.stderr


async def test_copy_refuses_a_source_behind_head_a_postgresql_instance_and_a_used_target(
    source: Settings, tmp_path: Path, target_url: str, admin_url: str
) -> None:
    head = head_revision()
    assert head is not None
    previous = ScriptDirectory.from_config(alembic_config("sqlite://")).get_revision(head).down_revision
    assert isinstance(previous, str)
    behind = tmp_path / "behind"
    behind.mkdir()
    await upgrade_async(f"sqlite+aiosqlite:///{behind / 'forgehand.db'}", previous)

    r = await copy(behind, target_url)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert f"is at revision {previous}, not {head}: run `forgehand db upgrade` first" in r.stderr
    assert await _tables(target_url) == set()  # nothing was created in the target

    r = await copy(behind, target_url, FORGEHAND_DATABASE_URL=admin_url)
    assert r.returncode == 2 and "already PostgreSQL" in r.stderr, r.stderr

    r = await copy(behind, "sqlite+aiosqlite:///elsewhere.db")
    assert (
        r.returncode == 2
        and "--to: expected postgresql+asyncpg://USER:PASSWORD@HOST/NAME, got 'sqlite+aiosqlite'" in r.stderr
    ), r.stderr

    await _execute(target_url, "CREATE TABLE notes (id integer)")
    r = await copy(source.data_dir, target_url)
    assert r.returncode == 2 and "tables that are not forgehand's (notes)" in r.stderr, r.stderr


async def _tables(url: str) -> set[str]:
    engine = create_async_engine(url)
    try:
        async with engine.connect() as conn:
            query = text("SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")
            return {row[0] for row in await conn.execute(query)}
    finally:
        await engine.dispose()


async def _execute(url: str, statement: str) -> None:
    engine = create_async_engine(url)
    try:
        async with engine.begin() as conn:
            await conn.execute(text(statement))
    finally:
        await engine.dispose()
