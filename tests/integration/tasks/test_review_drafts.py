"""Review drafts over REST and the review page: inline comments gathered on a pending review, seen
only by their author, published all at once with the verdict (a change request hands them to the
agent); inline comments are markdown, sanitised. Real database, real git, no worker."""

from typing import Any

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy import select

from forge.core.settings import Settings
from forge.db.engine import Database
from forge.db.models import AuditEvent
from tests.support.task_world import TASKS, World, agent_commits, build_task_world
from tests.support.web import csrf_from, sign_in

pytestmark = pytest.mark.db

T = f"{TASKS}/1"


@pytest.fixture
async def world(db: Database, settings: Settings) -> World:
    return await build_task_world(db, settings)


async def ready(client: AsyncTestClient[Litestar], world: World, db: Database, settings: Settings) -> None:
    body = {"goal": "greet", "agent": "fixer", "command": "true", "title": "Greet"}
    assert (await client.post(TASKS, json=body, headers=world.h("ana"))).status_code == 201
    await agent_commits(db, settings, 1, {"hello.txt": b"hello\n", "old.txt": b"one\nTWO\nthree\n"}, "greet")


def comment(line: int, body: str, path: str = "hello.txt") -> dict[str, Any]:
    return {"path": path, "line": line, "side": "head", "body": body}


async def test_a_draft_is_private_until_the_review_publishes_it(
    client: AsyncTestClient[Litestar], world: World, db: Database, settings: Settings
) -> None:
    await ready(client, world, db, settings)
    r = await client.post(f"{T}/review-draft/comments", json=comment(1, "say **hi**"), headers=world.h("wendy"))
    assert r.status_code == 201, r.text
    r = await client.post(
        f"{T}/review-draft/comments", json=comment(2, "and <script>x</script>", "old.txt"), headers=world.h("wendy")
    )
    assert [c["body"] for c in r.json()["comments"]] == ["say **hi**", "and <script>x</script>"]
    # Outside the diff: refused like a review's own comment.
    bad = await client.post(f"{T}/review-draft/comments", json=comment(99, "no"), headers=world.h("wendy"))
    assert bad.status_code == 422 and bad.json()["code"] == "comment_outside_diff"
    # Nobody else sees it, nothing counts or blocks, and another reviewer's draft is their own.
    assert (await client.get(f"{T}/reviews", headers=world.h("olga"))).json() == []
    assert (await client.get(f"{T}/review-draft", headers=world.h("olga"))).json() == {"comments": []}
    status = (await client.get(f"{T}/review-status", headers=world.h("olga"))).json()
    assert status["change_requests"] == [] and status["approvals"] == []
    # The agent never drafts a review of its own work.
    agent = await client.post(f"{T}/review-draft/comments", json=comment(1, "me"), headers=world.h("fixer"))
    assert agent.status_code == 403 and agent.json()["code"] == "agent_cannot_review"

    # Remove one; an unknown one is a 404 with its code.
    first, second = r.json()["comments"]
    left = await client.delete(f"{T}/review-draft/comments/{second['id']}", headers=world.h("wendy"))
    assert left.status_code == 200 and [c["id"] for c in left.json()["comments"]] == [first["id"]]
    gone = await client.delete(f"{T}/review-draft/comments/{second['id']}", headers=world.h("wendy"))
    assert gone.status_code == 404 and gone.json()["code"] == "review_comment_not_found"

    # Another reviewer's change request does not hand over wendy's draft.
    r = await client.post(f"{T}/review-draft/comments", json=comment(1, "olga's own"), headers=world.h("olga"))
    assert r.status_code == 201

    # Published with the verdict: no body needed, the draft's comment is the review's.
    r = await client.post(f"{T}/reviews", json={"verdict": "request_changes"}, headers=world.h("wendy"))
    assert r.status_code == 201, r.text
    review = r.json()
    assert review["verdict"] == "request_changes" and [c["body"] for c in review["comments"]] == ["say **hi**"]
    assert (await client.get(f"{T}/review-draft", headers=world.h("wendy"))).json() == {"comments": []}
    events = (await client.get(f"{T}/transcript", headers=world.h("wendy"))).json()["events"]
    [prompt] = [e for e in events if e["kind"] == "prompt" and e["payload"]["source"] == "review"]
    assert "say **hi**" in prompt["payload"]["text"] and "olga's own" not in prompt["payload"]["text"]
    listed = (await client.get(f"{T}/reviews", headers=world.h("olga"))).json()
    assert [x["author"] for x in listed] == ["wendy"]
    async with db.session() as s:
        actions = (await s.execute(select(AuditEvent.action))).scalars().all()
    assert actions.count("task.review_draft.comment") == 3 and "task.review_draft.remove" in actions


async def test_the_review_page_gathers_pending_comments_and_renders_markdown(
    client: AsyncTestClient[Litestar], world: World, db: Database, settings: Settings
) -> None:
    await ready(client, world, db, settings)
    assert (await sign_in(client, "wendy", "correct horse battery")).status_code in (302, 303)
    page = (await client.get("/ana/demo/tasks/1/review")).text
    form = {
        "csrf_token": csrf_from(page),
        "verdict": "comment",
        "path": "hello.txt",
        "side": "head",
        "line": "1",
        "comment": "use **bold** <img src=x onerror=alert(1)>",
        "commit_sha": "",
        "mode": "draft",
    }
    r = await client.post("/ana/demo/tasks/1/reviews", data=form, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"].endswith("/review#pending-comments"), r.text
    page = (await client.get("/ana/demo/tasks/1/review")).text
    assert "1 pending comment</strong>" in page and '<span class="badge">pending</span>' in page
    assert "<strong>bold</strong>" in page and "onerror" not in page
    # Outside the diff: the page again with the reason, never a 500.
    bad = await client.post("/ana/demo/tasks/1/reviews", data={**form, "line": "40"}, follow_redirects=False)
    assert bad.status_code == 422 and "is not in the diff" in bad.text
    # Submit with the verdict: published, and the pending list is empty again.
    r = await client.post(
        "/ana/demo/tasks/1/reviews",
        data={"csrf_token": form["csrf_token"], "verdict": "approve", "body": "fine"},
        follow_redirects=False,
    )
    assert r.status_code == 303
    page = (await client.get("/ana/demo/tasks/1/review")).text
    assert "No pending comments" in page and page.count("<strong>bold</strong>") == 2  # the review and the line
