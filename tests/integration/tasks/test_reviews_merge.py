"""Reviews and merge over REST, without a worker: the agent's runs are stood in for by real commits
on the task branch (the worker's part is tested in tests/docker). Real database, real git."""

import asyncio
from typing import Any

import pygit2
import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy import select

from forge.core.settings import Settings
from forge.db.audit import Actor
from forge.db.engine import Database
from forge.db.events import Event, TaskMerged
from forge.db.models import AuditEvent
from forge.git import RepoStore
from forge.git.bare import write_commit
from tasks.core.models import Task
from tests.support.task_world import AGENT, TASKS, World, agent_commits, bare_repo, build_task_world

pytestmark = pytest.mark.db

SYSTEM = Actor.system("test")


@pytest.fixture
async def world(db: Database, settings: Settings) -> World:
    return await build_task_world(db, settings)


async def start_task(client: AsyncTestClient[Litestar], world: World) -> dict[str, Any]:
    r = await client.post(
        TASKS, json={"goal": "greet", "agent": "fixer", "command": "true", "title": "Greet"}, headers=world.h("ana")
    )
    assert r.status_code == 201, r.text
    return dict(r.json())


async def test_review_request_changes_then_approve_and_merge(
    app: Litestar, client: AsyncTestClient[Litestar], world: World, db: Database, settings: Settings
) -> None:
    published: list[Event] = []

    async def seen(_: Any, event: Event) -> None:
        published.append(event)

    app.state.bus.subscribe(seen)
    await start_task(client, world)
    head = await agent_commits(db, settings, 1, {"hello.txt": b"hello\n", "old.txt": b"one\nTWO\nthree\n"}, "greet")
    t = f"{TASKS}/1"
    cmp = (await client.get(f"{t}/compare", headers=world.h("wendy"))).json()
    assert cmp["head_sha"] == head and sorted(f["path"] for f in cmp["files"]) == ["hello.txt", "old.txt"]

    # Merge rules: nobody approved yet.
    r = await client.post(f"{t}/merge", json={}, headers=world.h("ana"))
    assert r.status_code == 409 and r.json()["code"] == "merge_blocked", r.text
    assert "1 approval(s) of the current head needed" in r.json()["detail"]

    # Who may review, and on what.
    comment = {"path": "old.txt", "line": 2, "side": "head", "body": "why upper case?"}
    r = await client.post(f"{t}/reviews", json={"verdict": "approve"}, headers=world.h("rita"))
    assert r.status_code == 404, r.text  # a read-only collaborator does not see tasks
    r = await client.post(f"{t}/reviews", json={"verdict": "approve"}, headers=world.h("ana-tasks-only"))
    assert r.status_code == 403, r.text  # no reviews:write scope
    r = await client.post(f"{t}/reviews", json={"verdict": "approve"}, headers=world.h("fixer"))
    assert r.status_code == 403 and r.json()["code"] == "agent_cannot_review", r.text
    r = await client.post(f"{t}/reviews", json={"verdict": "approve", "commit_sha": "a" * 40}, headers=world.h("wendy"))
    assert r.status_code == 409 and r.json()["code"] == "stale_commit", r.text
    for bad in (
        {**comment, "line": 40},
        {**comment, "path": "keep.txt", "line": 1},
        {**comment, "side": "base", "line": 2, "path": "hello.txt"},
    ):
        r = await client.post(f"{t}/reviews", json={"verdict": "comment", "comments": [bad]}, headers=world.h("wendy"))
        assert r.status_code == 422 and r.json()["code"] == "comment_outside_diff", (bad, r.text)
    r = await client.post(f"{t}/reviews", json={"verdict": "comment", "body": " "}, headers=world.h("wendy"))
    assert r.status_code == 422 and r.json()["code"] == "review_empty", r.text

    # An inline comment, then a change request: the follow-up run's prompt carries both.
    r = await client.post(f"{t}/reviews", json={"verdict": "comment", "comments": [comment]}, headers=world.h("wendy"))
    assert r.status_code == 201, r.text
    assert r.json()["comments"][0]["quoted"] == "TWO" and r.json()["commit_sha"] == head
    r = await client.post(
        f"{t}/reviews",
        json={
            "verdict": "request_changes",
            "body": "Keep **lower case**.",
            "comments": [{"path": "hello.txt", "line": 1, "body": "say hi instead"}],
        },
        headers=world.h("wendy"),
    )
    assert r.status_code == 201, r.text
    assert r.json()["run"] == 2
    task = (await client.get(t, headers=world.h("ana"))).json()
    assert task["state"] == "queued" and [x["kind"] for x in task["runs"]] == ["start", "review"]
    events = (await client.get(f"{t}/transcript", headers=world.h("ana"))).json()["events"]
    [prompt] = [e["payload"] for e in events if e["kind"] == "prompt" and e["payload"]["source"] == "review"]
    text = prompt["text"]
    assert "Keep **lower case**." in text
    assert "old.txt, line 2:\n> TWO\nwhy upper case?" in text
    assert "hello.txt, line 1:\n> hello\nsay hi instead" in text

    # The agent's follow-up run moves the head: earlier reviews are outdated, not lost.
    new_head = await agent_commits(db, settings, 1, {"hello.txt": b"hi\n", "old.txt": b"one\ntwo\nthree\n"}, "hi")
    reviews = (await client.get(f"{t}/reviews", headers=world.h("ana"))).json()
    assert [x["verdict"] for x in reviews] == ["comment", "request_changes"]
    assert all(x["outdated"] for x in reviews) and all(c["outdated"] for x in reviews for c in x["comments"])
    r = await client.post(f"{t}/merge", json={}, headers=world.h("ana"))
    assert r.status_code == 409 and "changes requested by wendy" in r.json()["detail"], r.text

    r = await client.post(f"{t}/reviews", json={"verdict": "approve", "commit_sha": new_head}, headers=world.h("wendy"))
    assert r.status_code == 201, r.text
    status = (await client.get(f"{t}/review-status", headers=world.h("ana"))).json()
    assert status["approvals"] == ["wendy"] and status["blockers"] == []
    r = await client.post(f"{t}/merge", json={}, headers=world.h("rita"))
    assert r.status_code == 404, r.text
    r = await client.post(f"{t}/merge", json={"expected_head_sha": head}, headers=world.h("ana"))
    assert r.status_code == 409 and r.json()["code"] == "stale_head", r.text
    r = await client.post(
        f"{t}/merge", json={"strategy": "merge", "expected_head_sha": new_head}, headers=world.h("ana")
    )
    assert r.status_code == 200, r.text
    merged = r.json()
    assert merged["state"] == "merged" and merged["merge_strategy"] == "merge" and merged["merged_by"] == "ana"
    repo = bare_repo(settings)
    tip = repo.revparse_single("refs/heads/main").peel(pygit2.Commit)
    assert str(tip.id) == merged["merged_sha"]
    assert [str(p) for p in tip.parent_ids][1] == new_head
    assert tip.tree["hello.txt"].data == b"hi\n"
    assert repo.references.get(f"refs/heads/{merged['branch']}") is not None  # kept by default
    r = await client.post(f"{t}/merge", json={}, headers=world.h("ana"))
    assert r.status_code == 409 and r.json()["code"] == "task_not_in_review", r.text

    async with db.session() as s:
        actions = (await s.execute(select(AuditEvent.action).where(AuditEvent.result == "ok"))).scalars().all()
    assert actions.count("task.review") == 3 and actions.count("task.merge") == 1
    types = [e.type for e in published]
    assert types.count("review.submitted") == 3 and types.count("task.merged") == 1
    [done] = [e for e in published if e.type == "task.merged"]
    assert isinstance(done.data, TaskMerged)
    assert done.data.merged_sha == merged["merged_sha"] and done.data.strategy == "merge"
    assert done.actor is not None and done.actor.login == "ana"


async def test_two_approvals_at_once_and_squash_deleting_the_branch(
    client: AsyncTestClient[Litestar], world: World, db: Database, settings: Settings
) -> None:
    r = await client.put(
        "/api/v1/repos/ana/demo/task-settings",
        json={"required_approvals": 2, "approval_not_by_starter": True, "delete_branch_on_merge": True},
        headers=world.h("ana"),
    )
    assert r.status_code == 200, r.text
    await start_task(client, world)
    head = await agent_commits(db, settings, 1, {"new.txt": b"new\n"}, "add new")
    t = f"{TASKS}/1"
    # The starter's approval does not count here.
    r = await client.post(f"{t}/reviews", json={"verdict": "approve"}, headers=world.h("ana"))
    assert r.status_code == 201, r.text
    answers = await asyncio.gather(
        *(client.post(f"{t}/reviews", json={"verdict": "approve"}, headers=world.h(who)) for who in ("wendy", "olga"))
    )
    assert [a.status_code for a in answers] == [201, 201], [a.text for a in answers]
    status = (await client.get(f"{t}/review-status", headers=world.h("ana"))).json()
    assert status["approvals"] == ["olga", "wendy"] and status["blockers"] == []
    r = await client.post(f"{t}/merge", json={"strategy": "squash", "expected_head_sha": head}, headers=world.h("ana"))
    assert r.status_code == 200, r.text
    repo = bare_repo(settings)
    tip = repo.revparse_single("refs/heads/main").peel(pygit2.Commit)
    assert len(tip.parent_ids) == 1 and tip.tree["new.txt"].data == b"new\n"
    assert tip.message.startswith("Greet (task #1)") and "Approved-by: olga" in tip.message
    assert repo.references.get(f"refs/heads/{r.json()['branch']}") is None


async def test_conflict_is_reported_file_by_file_and_nothing_moves(
    client: AsyncTestClient[Litestar], world: World, db: Database, settings: Settings
) -> None:
    await start_task(client, world)
    await agent_commits(db, settings, 1, {"old.txt": b"one\nagent\nthree\n", "keep.txt": b"agent\n"}, "edit")
    store = RepoStore(settings.data_dir / "repos")
    try:
        files = {"old.txt": b"one\nhuman\nthree\n", "keep.txt": b"human\n"}
        await store.write(("ana", "demo"), write_commit, branch="main", files=files, message="meanwhile", author=AGENT)
    finally:
        await store.close()
    before = str(bare_repo(settings).revparse_single("refs/heads/main").id)
    r = await client.post(f"{TASKS}/1/reviews", json={"verdict": "approve"}, headers=world.h("wendy"))
    assert r.status_code == 201
    for strategy in ("merge", "squash"):
        r = await client.post(f"{TASKS}/1/merge", json={"strategy": strategy}, headers=world.h("ana"))
        assert r.status_code == 409 and r.json()["code"] == "merge_conflict", r.text
        assert sorted(c["path"] for c in r.json()["conflicts"]) == ["keep.txt", "old.txt"]
    r = await client.post(f"{TASKS}/1/merge", json={"strategy": "fast-forward"}, headers=world.h("ana"))
    assert r.status_code == 409 and r.json()["code"] in ("merge_conflict", "not_fast_forward"), r.text
    assert str(bare_repo(settings).revparse_single("refs/heads/main").id) == before
    assert (await client.get(f"{TASKS}/1", headers=world.h("ana"))).json()["state"] == "awaiting_review"


async def test_reviews_need_a_task_in_review(client: AsyncTestClient[Litestar], world: World) -> None:
    await start_task(client, world)  # queued: nothing to review yet
    r = await client.post(f"{TASKS}/1/reviews", json={"verdict": "approve"}, headers=world.h("wendy"))
    assert r.status_code == 409 and r.json()["code"] == "task_not_in_review", r.text
    r = await client.post(f"{TASKS}/1/merge", json={"strategy": "rebase"}, headers=world.h("ana"))
    assert r.status_code == 422, r.text
    r = await client.post(f"{TASKS}/9/reviews", json={"verdict": "approve"}, headers=world.h("wendy"))
    assert r.status_code == 404, r.text


async def test_review_page_renders_hostile_reviews_inert(
    client: AsyncTestClient[Litestar], world: World, db: Database, settings: Settings
) -> None:
    await start_task(client, world)
    await agent_commits(db, settings, 1, {"x.html": b"<script>alert('diff')</script>\n"}, "<b>summary</b>")
    hostile = "<script>alert(1)</script><img src=x onerror=alert(2)>\n\n**bold** [click](javascript:alert(3))"
    comment = {"path": "x.html", "line": 1, "body": "<script>alert(4)</script>"}
    r = await client.post(
        f"{TASKS}/1/reviews",
        json={"verdict": "comment", "body": hostile, "comments": [comment]},
        headers=world.h("wendy"),
    )
    assert r.status_code == 201, r.text
    page = await client.get("/ana/demo/tasks/1/review", headers=world.h("wendy"))
    assert page.status_code == 200, page.text
    html = page.text
    assert "<strong>bold</strong>" in html  # markdown is rendered...
    for bad in ("<script>alert", "onerror", 'href="javascript:'):
        assert bad not in html, bad  # ...and nothing of it runs
    # Inline comments are markdown too: the sanitiser drops the script, body and all; the diff's
    # line is code, shown as text.
    assert "alert(4)" not in html and "&lt;script&gt;alert(&#39;diff&#39;)" in html
    assert 'aria-label="Comment on x.html line 1"' in html


async def test_admins_set_the_merge_rules_on_the_settings_page(client: AsyncTestClient[Litestar], world: World) -> None:
    from tests.support.web import csrf_from, sign_in

    assert (await sign_in(client, "ana", "correct horse battery")).status_code in (302, 303)
    page = await client.get("/ana/demo/settings/tasks/")
    assert page.status_code == 200 and 'id="task-settings"' in page.text
    token = csrf_from(page.text[page.text.index('id="task-settings"') :])
    form = {"csrf_token": token, "required_approvals": "2", "delete_branch_on_merge": "1", "model_api_key": "sk-x"}
    r = await client.post("/ana/demo/settings/tasks/", data=form)
    assert r.status_code == 200 and "Saved." in r.text, r.text
    assert "sk-x" not in r.text and "one is stored" in r.text
    for bad in ("abc", "11"):
        r = await client.post("/ana/demo/settings/tasks/", data={**form, "required_approvals": bad})
        assert r.status_code == 422 and 'role="alert"' in r.text, r.text
    saved = (await client.get("/api/v1/repos/ana/demo/task-settings", headers=world.h("ana"))).json()
    assert saved["required_approvals"] == 2 and saved["delete_branch_on_merge"] is True
    assert saved["approval_not_by_starter"] is False and saved["model_api_key_set"] is True
    # Only repository admins: a write collaborator is refused.
    client.cookies.clear()
    r = await client.get("/ana/demo/settings/tasks/", headers=world.h("wendy"))
    assert r.status_code in (403, 404), r.text


async def test_only_current_reviewers_count_and_the_agent_cannot_merge(
    client: AsyncTestClient[Litestar], world: World, db: Database, settings: Settings
) -> None:
    await start_task(client, world)
    await agent_commits(db, settings, 1, {"a.txt": b"a\n"}, "a")
    t = f"{TASKS}/1"
    assert (await client.post(f"{t}/reviews", json={"verdict": "approve"}, headers=world.h("wendy"))).status_code == 201
    r = await client.post(f"{t}/reviews", json={"verdict": "request_changes", "body": "no"}, headers=world.h("olga"))
    assert r.status_code == 201, r.text
    await agent_commits(db, settings, 1, {"a.txt": b"b\n"}, "b")  # the follow-up run's result
    r = await client.post(f"{t}/reviews", json={"verdict": "approve"}, headers=world.h("wendy"))
    assert r.status_code == 201, r.text
    # olga leaves the project: her change request no longer blocks; wendy loses access: her
    # approval no longer counts.
    r = await client.delete("/api/v1/repos/ana/demo/collaborators/olga", headers=world.h("ana"))
    assert r.status_code == 204, r.text
    status = (await client.get(f"{t}/review-status", headers=world.h("ana"))).json()
    assert status["change_requests"] == [] and status["approvals"] == ["wendy"]
    r = await client.delete("/api/v1/repos/ana/demo/collaborators/wendy", headers=world.h("ana"))
    assert r.status_code == 204, r.text
    status = (await client.get(f"{t}/review-status", headers=world.h("ana"))).json()
    assert status["approvals"] == [] and status["blockers"], status
    r = await client.post(f"{t}/merge", json={}, headers=world.h("ana"))
    assert r.status_code == 409 and r.json()["code"] == "merge_blocked", r.text
    # ana approves (the starter's approval counts by default); the agent still cannot merge.
    assert (await client.post(f"{t}/reviews", json={"verdict": "approve"}, headers=world.h("ana"))).status_code == 201
    r = await client.post(f"{t}/merge", json={}, headers=world.h("fixer"))
    assert r.status_code == 403 and r.json()["code"] == "agent_cannot_merge", r.text
    assert (await client.post(f"{t}/merge", json={}, headers=world.h("ana"))).status_code == 200


async def test_a_squash_whose_database_commit_was_lost_is_found_again(
    client: AsyncTestClient[Litestar], world: World, db: Database, settings: Settings
) -> None:
    await start_task(client, world)
    head = await agent_commits(db, settings, 1, {"s.txt": b"s\n"}, "s")
    assert (await client.post(f"{TASKS}/1/reviews", json={"verdict": "approve"}, headers=world.h("wendy"))).is_success
    r = await client.post(f"{TASKS}/1/merge", json={"strategy": "squash"}, headers=world.h("ana"))
    assert r.status_code == 200, r.text
    squashed = r.json()["merged_sha"]
    async with db.session(write=True) as s:  # as if the merge's transaction never committed
        task = (await s.execute(select(Task).where(Task.number == 1))).scalar_one()
        task.state, task.merged_sha, task.merge_strategy, task.merged_by_id = "awaiting_review", "", "", None
    r = await client.post(
        f"{TASKS}/1/merge", json={"strategy": "squash", "expected_head_sha": head}, headers=world.h("ana")
    )
    assert r.status_code == 200, r.text
    assert r.json()["merged_sha"] == squashed and r.json()["merge_strategy"] == "already_merged"
    assert str(bare_repo(settings).revparse_single("refs/heads/main").id) == squashed  # no second commit


async def test_hostile_bytes_are_refused_or_stored_safely(
    client: AsyncTestClient[Litestar], world: World, db: Database, settings: Settings
) -> None:
    await start_task(client, world)
    # A NUL past the binary sniffing window: the file diffs as text, its line holds a NUL.
    text = b"x" * 9000 + b"\n" + b"bad\x00line\n"
    await agent_commits(db, settings, 1, {"nul.txt": text}, "nul")
    comment = {"path": "nul.txt", "line": 2, "body": "what is this?"}
    r = await client.post(
        f"{TASKS}/1/reviews", json={"verdict": "comment", "comments": [comment]}, headers=world.h("wendy")
    )
    assert r.status_code == 201, r.text
    assert "\x00" not in r.json()["comments"][0]["quoted"]
    for body in ("a\x00b", "x"):
        r = await client.post(
            f"{TASKS}/1/reviews",
            json={"verdict": "comment", "body": body, "comments": [{**comment, "body": body}]},
            headers=world.h("wendy"),
        )
        assert r.status_code == (422 if "\x00" in body else 201), r.text
    from tests.support.web import csrf_from, sign_in

    await sign_in(client, "ana", "correct horse battery")
    page = await client.get("/ana/demo/settings/tasks/")
    token = csrf_from(page.text[page.text.index('id="task-settings"') :])
    r = await client.post("/ana/demo/settings/tasks/", data={"csrf_token": token, "turn_limit": "²"})
    assert r.status_code == 422, r.text
    review = await client.get("/ana/demo/tasks/1/review")
    token = csrf_from(review.text[review.text.index('id="review-form"') :])
    r = await client.post(
        "/ana/demo/tasks/1/reviews",
        data={"csrf_token": token, "verdict": "comment", "path": "nul.txt", "line": "¹", "comment": "x"},
    )
    # Not a line number: no inline comment is made, and an empty comment review is refused (no 500).
    assert r.status_code == 422 and "say something" in r.text, r.text


async def test_required_checks_block_the_merge_until_ci_reports_success(
    client: AsyncTestClient[Litestar], world: World, db: Database, settings: Settings
) -> None:
    """A branch rule names the status contexts a head needs: the merge box lists each one missing
    or not passing in words, and the merge goes through once CI reports `success` on the head."""
    rules = "/api/v1/repos/ana/demo/branch-rules"
    r = await client.post(
        rules, json={"pattern": "ma*", "required_checks": ["ci/build", "lint"]}, headers=world.h("ana")
    )
    assert r.status_code == 201 and r.json()["required_checks"] == ["ci/build", "lint"], r.text
    for bad in (["ci\nbuild"], [""], ["x"] * 21):
        r = await client.post(rules, json={"pattern": "x", "required_checks": bad}, headers=world.h("ana"))
        assert r.status_code == 422 and r.json()["code"] in ("invalid_required_checks", "validation_failed"), r.text
    await start_task(client, world)
    head = await agent_commits(db, settings, 1, {"hello.txt": b"hello\n"}, "greet")
    r = await client.post(f"{TASKS}/1/reviews", json={"verdict": "approve"}, headers=world.h("wendy"))
    assert r.status_code == 201, r.text

    async def merge() -> Any:
        return await client.post(f"{TASKS}/1/merge", json={}, headers=world.h("ana"))

    async def report(state: str, context: str) -> None:
        body = {"state": state, "context": context, "target_url": "https://ci.example/1"}
        r = await client.post(f"/api/v1/repos/ana/demo/statuses/{head}", json=body, headers=world.h("wendy"))
        assert r.status_code == 201, r.text

    r = await merge()
    assert r.status_code == 409 and r.json()["code"] == "merge_blocked", r.text
    assert r.json()["blockers"] == ["required check ci/build has not reported", "required check lint has not reported"]
    assert (await client.get(f"{TASKS}/1/review-status", headers=world.h("ana"))).json()["checks"] is None
    await report("success", "lint")
    await report("pending", "ci/build")
    await report("failure", "ci/build")
    r = await merge()
    assert r.status_code == 409 and r.json()["blockers"] == ["required check ci/build is failure"], r.text
    assert bare_repo(settings).revparse_single("refs/heads/main").id != pygit2.Oid(hex=head)
    review = (await client.get(f"{TASKS}/1/review-status", headers=world.h("ana"))).json()
    assert review["blockers"] == ["required check ci/build is failure"] and review["checks"] == "failure"
    html = (await client.get("/ana/demo/tasks/1/review", headers=world.h("ana"))).text
    box = html[html.index('id="head-checks"') :]
    assert f'href="/ana/demo/commit/{head}#checks-title">failure</a>' in box[: box.index("</p>")]
    assert "<li>required check ci/build is failure</li>" in html
    await report("success", "ci/build")
    r = await merge()
    assert r.status_code == 200, r.text
