"""Which token scopes read a task's file contents (issue 13): a diff, and the line a review
comment quotes, are `repo:read`'s; `tasks:read` alone reads the task, its reviews and the merge
rules' verdict but not the files. A matrix of scopes x endpoints (real database, real git)."""

from typing import Any

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient

from forge.accounts import accounts, tokens
from forge.core.settings import Settings
from forge.db.engine import Database
from tests.support.task_world import SYSTEM, TASKS, World, agent_commits, build_task_world

T = f"{TASKS}/1"
# token name -> its scopes (all of ana, the repository's owner: only the scopes differ)
SCOPES = {
    "tasks-read": ["tasks:read"],
    "tasks-write": ["tasks:write"],
    "tasks-read+repo-read": ["tasks:read", "repo:read"],
    "tasks-write+repo-write": ["tasks:write", "repo:write"],
    "reviews-write": ["reviews:write"],
}
CONTENTS = {"tasks-read+repo-read", "tasks-write+repo-write", "reviews-write"}


@pytest.fixture
async def world(db: Database, settings: Settings) -> World:
    w = await build_task_world(db, settings)
    async with db.session(write=True) as s:
        ana = await accounts.require_by_login(s, "ana")
        for name, scopes in SCOPES.items():
            w.tokens[name] = (await tokens.create(s, SYSTEM, ana, name, scopes, None)).token
    return w


async def reviewed_task(client: AsyncTestClient[Litestar], world: World, db: Database, settings: Settings) -> None:
    body = {"goal": "shout", "agent": "fixer", "command": "true", "title": "Shout"}
    assert (await client.post(TASKS, json=body, headers=world.h("ana"))).status_code == 201
    await agent_commits(db, settings, 1, {"old.txt": b"one\nTWO\nthree\n"}, "shout")
    comment = {"path": "old.txt", "line": 2, "body": "why?"}
    r = await client.post(f"{T}/reviews", json={"verdict": "comment", "comments": [comment]}, headers=world.h("wendy"))
    assert r.status_code == 201 and r.json()["comments"][0]["quoted"] == "TWO", r.text


@pytest.mark.parametrize("who", sorted(SCOPES))
async def test_file_contents_need_repo_read(
    client: AsyncTestClient[Litestar], world: World, db: Database, settings: Settings, who: str
) -> None:
    await reviewed_task(client, world, db, settings)
    h = world.h(who)
    reads_files = who in CONTENTS

    # The task itself, its transcript and the merge rules' verdict: tasks:read is enough.
    for path in (T, f"{T}/transcript", f"{T}/review-status"):
        r = await client.get(path, headers=h)
        assert r.status_code == 200, (path, r.text)

    # The diff shows file contents.
    r = await client.get(f"{T}/compare", headers=h)
    if reads_files:
        assert r.status_code == 200, r.text
        patch: Any = r.json()
        assert "TWO" in str(patch)
    else:
        assert r.status_code == 403 and r.json()["code"] == "insufficient_scope", r.text
        assert "TWO" not in r.text

    # The reviews are there for every reader; the quoted line only for one that reads files.
    r = await client.get(f"{T}/reviews", headers=h)
    assert r.status_code == 200, r.text
    [review] = r.json()
    assert review["comments"][0]["body"] == "why?"
    assert review["comments"][0]["quoted"] == ("TWO" if reads_files else "")

    # The review page (a token may read pages too) shows the diff and the quoted line only then.
    r = await client.get("/ana/demo/tasks/1/review", headers=h)
    assert r.status_code == 200, r.text
    assert ("TWO" in r.text) is reads_files
    assert ("needs the repo:read scope" in r.text) is not reads_files
