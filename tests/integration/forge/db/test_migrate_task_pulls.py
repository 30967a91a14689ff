"""A database made by the release before pull requests: its tasks in review become pull requests
when it is upgraded, and the app reads them as any other, with the reviews and inline comments
their tasks had (read through the pull request API, on SQLite and PostgreSQL)."""

import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from litestar.testing import AsyncTestClient
from sqlalchemy.ext.asyncio import create_async_engine

from forge.app.factory import create_app
from forge.core.settings import load_settings, prepare_data_dir
from forge.db.engine import Database
from forge.db.migrate import upgrade, upgrade_async
from tests.support import databases
from tests.support.accounts import Accounts

PREVIOUS_RELEASE = "0023"  # the schema before pull requests


def _insert(conn: sa.Connection, table: str, **values: Any) -> int:
    """A row with every required column filled (values by type where the test does not care)."""
    meta = sa.MetaData()
    t = sa.Table(table, meta, autoload_with=conn)
    row: dict[str, Any] = {}
    for c in t.columns:
        if c.name in values or c.nullable or c.server_default is not None or (c.primary_key and c.autoincrement):
            continue
        kind = c.type.python_type if not isinstance(c.type, sa.JSON) else list
        row[c.name] = {int: 0, str: "", bool: False, datetime: datetime.now(UTC), list: []}.get(kind, "")
    row.update(values)
    return int(conn.execute(t.insert().values(**row)).inserted_primary_key[0])


def test_tasks_in_review_become_pull_requests(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    upgrade(f"sqlite+aiosqlite:///{tmp_path / 'old.db'}", PREVIOUS_RELEASE)
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        ana = _insert(conn, "accounts", login="ana", login_key="ana", type="User")
        bot = _insert(conn, "accounts", login="fixer", login_key="fixer", type="Bot")
        repo = _insert(
            conn, "repositories", uuid="r-1", owner_id=ana, name="demo", name_key="demo", visibility="private"
        )
        common = {
            "repo_id": repo,
            "agent_id": bot,
            "started_by_id": ana,
            "runtime": "command",
            "goal": "g",
            "base": "main",
        }
        _insert(conn, "tasks", uuid="t-1", number=1, title="Fix\nit", branch="agent/1-fix", base_sha="a" * 40,
                head_sha="b" * 40, state="awaiting_review", summary="Fixed.", **common)  # fmt: skip
        _insert(conn, "tasks", uuid="t-2", number=2, title="Nothing", branch="agent/2-nothing", base_sha="a" * 40,
                head_sha="a" * 40, state="awaiting_review", **common)  # fmt: skip
        _insert(conn, "tasks", uuid="t-3", number=3, title="Merged", branch="agent/3-merged", base_sha="a" * 40,
                head_sha="c" * 40, state="merged", **common)  # fmt: skip
    upgrade(f"sqlite+aiosqlite:///{tmp_path / 'old.db'}")
    with engine.connect() as conn:
        pulls = conn.execute(sa.text("SELECT number, title, head_ref, base_ref, head_sha, state, author_id, body "
                                     "FROM pull_requests")).all()  # fmt: skip
        tasks = dict(conn.execute(sa.text("SELECT number, result_pull_number FROM tasks")).all())
        counter = conn.execute(sa.text("SELECT last_number FROM issue_counters WHERE repo_id = :r"), {"r": repo})
        last = counter.scalar_one()
    assert [tuple(p) for p in pulls] == [
        (1, "Fix it", "agent/1-fix", "main", "b" * 40, "open", bot, "Fixed.\n\nThe work of task #1.\n")
    ]
    assert tasks == {1: 1, 2: None, 3: None}  # only work in review with changes
    assert last == 1  # the next pull request or issue is #2
    engine.dispose()


@pytest.fixture
async def old_url(db_url: str, tmp_path: Path) -> str:
    """A database of the kind `db_url` is, at the previous release's schema."""
    if db_url.startswith("postgresql"):
        url = await databases.postgres_empty(os.environ["FORGEHAND_TEST_DATABASE_URL"])
    else:
        url = f"sqlite+aiosqlite:///{tmp_path / 'old.db'}"
    await upgrade_async(url, PREVIOUS_RELEASE)
    return url


def _task_reviewed_before_pull_requests(conn: sa.Connection) -> None:
    """What the previous release stored for a task in review after a change request: the review
    (its body), its inline comment on a line (the line quoted), and the follow-up run it started."""
    reviewed_at = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)
    ana = _insert(conn, "accounts", login="ana", login_key="ana", type="User")
    wendy = _insert(conn, "accounts", login="wendy", login_key="wendy", type="User")
    bot = _insert(conn, "accounts", login="fixer", login_key="fixer", type="Bot")
    repo = _insert(conn, "repositories", uuid="r-1", owner_id=ana, name="demo", name_key="demo", visibility="private")
    for who in (wendy, bot):
        _insert(conn, "collaborators", repo_id=repo, account_id=who, role="write")
    task = _insert(conn, "tasks", uuid="t-1", number=1, title="Fix it", branch="agent/1-fix", base="main",
                   base_sha="a" * 40, head_sha="b" * 40, state="awaiting_review", summary="Fixed.",
                   repo_id=repo, agent_id=bot, started_by_id=ana, runtime="command", goal="g")  # fmt: skip
    # The change request sent the agent back to work (run 2), which ended with nothing new.
    _insert(conn, "task_runs", uuid="run-1", task_id=task, repo_id=repo, seq=1, kind="start", state="succeeded")
    run = _insert(conn, "task_runs", uuid="run-2", task_id=task, repo_id=repo, seq=2, kind="review",
                  state="succeeded", requested_by_id=wendy)  # fmt: skip
    review = _insert(conn, "task_reviews", uuid="rv-1", task_id=task, repo_id=repo, author_id=wendy,
                     verdict="request_changes", body="Handle the empty list.", commit_sha="b" * 40,
                     run_id=run, created_at=reviewed_at)  # fmt: skip
    _insert(conn, "task_review_comments", review_id=review, task_id=task, path="src/sum.py", side="head",
            line=7, body="This fails on `[]`.", quoted="    return xs[0] + total(xs[1:])",
            commit_sha="b" * 40, sent_run_id=run, created_at=reviewed_at)  # fmt: skip


async def test_a_tasks_reviews_are_its_pull_requests_after_the_upgrade(old_url: str, tmp_path: Path) -> None:
    """A change request with its line comment, written on a task before pull requests existed,
    reads through the pull request API on the task's pull request once the database is upgraded."""
    engine = create_async_engine(old_url)
    try:
        async with engine.begin() as conn:
            await conn.run_sync(_task_reviewed_before_pull_requests)
    finally:
        await engine.dispose()
    await upgrade_async(old_url)

    settings = prepare_data_dir(
        load_settings(
            environ={}, data_dir=tmp_path / "data", database_url=old_url, base_url="http://testserver.local",
            log_level="warning", run_worker=False, seed_demo=False,
        )
    )  # fmt: skip
    db = Database(settings.effective_database_url)
    try:
        token = await Accounts(db=db).token("ana", "repo:read", "tasks:read")
    finally:
        await db.dispose()
    api = "/api/v1/repos/ana/demo/pulls"
    async with AsyncTestClient(app=create_app(settings), base_url="http://testserver.local") as c:
        c.headers["Authorization"] = f"Bearer {token}"
        pulls = await c.get(api)
        assert [(p["number"], p["head"]["ref"]) for p in pulls.json()] == [(1, "agent/1-fix")], pulls.text
        reviews = await c.get(f"{api}/1/reviews")
        assert reviews.status_code == 200, reviews.text
        assert [(r["state"], r["body"], r["user"], r["commit_id"]) for r in reviews.json()] == [
            ("CHANGES_REQUESTED", "Handle the empty list.", {"login": "wendy", "type": "User"}, "b" * 40)
        ]
        comments = await c.get(f"{api}/1/comments")
        assert comments.status_code == 200, comments.text
        assert [
            (x["path"], x["line"], x["side"], x["body"], x["user"]["login"], x["pull_request_review_id"])
            for x in comments.json()
        ] == [("src/sum.py", 7, "RIGHT", "This fails on `[]`.", "wendy", reviews.json()[0]["id"])]
