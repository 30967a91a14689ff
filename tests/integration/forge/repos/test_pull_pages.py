"""The pull request page's forms without a browser: close and reopen, a suggestion committed from
its button, a thread resolved, a refused form shown again with its reason (not an error page), and
a task's pull request taking line comments and a pending review into the task's review."""

import re
from typing import Any

from litestar.testing import AsyncTestClient

from forge.core.settings import Settings
from forge.db.engine import Database
from forge.git import Identity
from forge.git.bare import write_commit
from tests.support.accounts import PASSWORD, Accounts
from tests.support.task_world import TASKS, agent_commits, build_task_world, open_task_pull
from tests.support.web import csrf_from, sign_in

API = "/api/v1/repos/ana/shop"
ANA = Identity(name="Ana", email="ana@example.org")


async def _pull(client: AsyncTestClient[Any], make: Accounts) -> tuple[str, int]:
    """ana's repository with a branch `change` one commit ahead of main, its pull request open, and
    bob's line comment suggesting a change; returns bob's token and the comment's id."""
    await make.user("ana")
    await make.user("bob")
    ana = await make.token("ana", "repo:write", "reviews:write")
    bob = await make.token("bob", "repo:write", "reviews:write")
    h = {"Authorization": f"Bearer {ana}"}
    assert (await client.post("/api/v1/user/repos", json={"name": "shop", "auto_init": True}, headers=h)).is_success
    await client.put(f"{API}/collaborators/bob", json={"role": "write"}, headers=h)
    store = client.app.state.repo_store
    main = (await client.get(f"{API}/branches", headers=h)).json()[0]["sha"]
    await store.write(("ana", "shop"), lambda repo: repo.references.create("refs/heads/change", main))
    await store.write(("ana", "shop"), write_commit, branch="change", files={"a.txt": "one\n"}, message="a", author=ANA)
    r = await client.post(f"{API}/pulls", json={"title": "A", "head": "change", "base": "main"}, headers=h)
    assert r.status_code == 201, r.text
    body = "```suggestion\nONE\n```"
    comment = {"body": body, "path": "a.txt", "line": 1}
    r = await client.post(f"{API}/pulls/1/comments", json=comment, headers={"Authorization": f"Bearer {bob}"})
    assert r.status_code == 201, r.text
    return bob, int(r.json()["id"])


async def _form(client: AsyncTestClient[Any], path: str, **fields: str) -> Any:
    page = await client.get("/ana/shop/pull/1")
    return await client.post(path, data={"csrf_token": csrf_from(page.text), **fields}, follow_redirects=False)


async def test_the_page_forms_act_and_come_back(client: AsyncTestClient[Any], make: Accounts) -> None:
    bob, comment = await _pull(client, make)
    await sign_in(client, "ana", PASSWORD)
    closed = await _form(client, "/ana/shop/pull/1/state", state="closed")
    assert closed.status_code == 303 and closed.headers["location"] == "/ana/shop/pull/1"
    assert (await client.get(f"{API}/pulls/1", headers={"Authorization": f"Bearer {bob}"})).json()["state"] == "closed"
    assert (await _form(client, "/ana/shop/pull/1/state", state="open")).status_code == 303

    applied = await _form(client, f"/ana/shop/pull/1/comments/{comment}/apply")
    assert applied.status_code == 303 and applied.headers["location"] == "/ana/shop/pull/1#files"
    pull = (await client.get(f"{API}/pulls/1", headers={"Authorization": f"Bearer {bob}"})).json()
    blob = await client.get(f"{API}/raw/{pull['head']['sha']}/a.txt", headers={"Authorization": f"Bearer {bob}"})
    assert blob.text == "ONE\n"

    resolved = await _form(client, f"/ana/shop/pull/1/comments/{comment}/resolve")
    assert resolved.headers["location"] == f"/ana/shop/pull/1#comment-{comment}"
    assert "resolved by ana" in (await client.get("/ana/shop/pull/1")).text

    asked = await _form(client, "/ana/shop/pull/1/reviewers", reviewers="bob")
    assert asked.status_code == 303 and asked.headers["location"] == "/ana/shop/pull/1#reviewers"
    assert "Review requested from <strong>bob</strong>" in (await client.get("/ana/shop/pull/1")).text
    nobody = await _form(client, "/ana/shop/pull/1/reviewers", reviewers="ghost")
    assert nobody.status_code == 422 and "ghost" in nobody.text and 'value="ghost"' in nobody.text

    # applied once, the suggestion is on an older head: refused on the page, with the reason
    again = await _form(client, f"/ana/shop/pull/1/comments/{comment}/apply")
    assert again.status_code == 409 and "it no longer applies as written" in again.text
    assert 'id="pull-error"' in again.text


async def test_a_tasks_line_comments_and_pending_review_on_its_pull_request_page(
    client: AsyncTestClient[Any], db: Database, settings: Settings
) -> None:
    """A task's pull request takes line comments like any other, into the task's review: Add to
    review gathers them in the reader's pending review of the task (Discard throws it away), Comment
    now is a comment review of the task, and the review form's change request publishes the pending
    comments and sends the agent back to work."""
    world = await build_task_world(db, settings)
    start = {"goal": "greet", "agent": "fixer", "command": "true", "title": "Greet"}
    assert (await client.post(TASKS, json=start, headers=world.h("ana"))).status_code == 201
    head = await agent_commits(db, settings, 1, {"hello.txt": b"hello\n"}, "greet")
    assert await open_task_pull(db, settings, "http://testserver.local") == 1
    await sign_in(client, "wendy", "correct horse battery")
    page = "/ana/demo/pull/1"
    line = {"path": "hello.txt", "line": "1", "side": "RIGHT", "body": "say **hi**"}

    added = await _task_form(client, f"{page}/comments", **line, mode="review")
    assert added.status_code == 303 and added.headers["location"] == f"{page}#pending-review"
    shown = (await client.get(page)).text
    assert "Your pending review: 1 comment" in shown and '<span class="badge">pending</span>' in shown
    assert "<strong>hi</strong>" in shown and 'id="task-comment-' in shown
    outside = await _task_form(client, f"{page}/comments", **{**line, "line": "40"}, mode="review")
    assert outside.status_code == 422 and "is not in the diff" in outside.text and 'id="pull-error"' in outside.text
    pending = re.search(r'action="/ana/demo/pull/1/reviews/(\d+)/discard"', shown)
    assert pending is not None
    discarded = await _task_form(client, f"{page}/reviews/{pending.group(1)}/discard")
    assert discarded.status_code == 303 and discarded.headers["location"] == f"{page}#review"
    assert "Your pending review" not in (await client.get(page)).text
    assert (await client.get(f"{TASKS}/1/review-draft", headers=world.h("wendy"))).json() == {"comments": []}

    now = await _task_form(client, f"{page}/comments", **{**line, "body": "too formal"})
    assert now.status_code == 303 and re.fullmatch(rf"{page}#review-\d+", now.headers["location"])
    shown = (await client.get(page)).text
    assert "wendy</strong> commented" in shown and "<pre>hello</pre>" in shown  # the line it is about, quoted
    assert await _task_form(client, f"{page}/comments", **line, mode="review")
    asked = await _task_form(client, f"{page}/reviews", event="REQUEST_CHANGES", body="More.", commit_id=head)
    assert asked.status_code == 303, asked.text
    task = (await client.get(f"{TASKS}/1", headers=world.h("ana"))).json()
    assert task["state"] == "queued" and [r["kind"] for r in task["runs"]] == ["start", "review"]
    reviews = (await client.get(f"{TASKS}/1/reviews", headers=world.h("ana"))).json()
    assert [(r["verdict"], [c["body"] for c in r["comments"]]) for r in reviews] == [
        ("comment", ["too formal"]), ("request_changes", ["say **hi**"]),
    ]  # fmt: skip


async def _task_form(client: AsyncTestClient[Any], action: str, **fields: str) -> Any:
    page = await client.get("/ana/demo/pull/1")
    return await client.post(action, data={"csrf_token": csrf_from(page.text), **fields}, follow_redirects=False)
