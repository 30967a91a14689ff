"""A database made by the release before pull requests: its tasks in review become pull requests
when it is upgraded, and the app reads them as any other."""

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from forge.db.migrate import upgrade

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
