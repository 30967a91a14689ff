"""Issues over REST as a team and its bots drive them (GitHub's paths and shapes): open, label,
assign, milestone, comment, edit with history, close with a reason, reopen, the timeline and the
filters; who may do what; what is refused; the audit rows and the webhooks."""

from typing import Any

import msgspec
import pygit2
import pytest
from litestar.testing import AsyncTestClient
from sqlalchemy import select

from forge.core.settings import Settings
from forge.db.engine import Database
from forge.db.models import AuditEvent
from tests.support.accounts import Accounts
from webhooks.core.models import WebhookOutbox

API = "/api/v1/repos/ana/proj"


@pytest.fixture
def settings(settings: Settings) -> Settings:  # a notify endpoint on 127.0.0.1 (nothing listens)
    return msgspec.structs.replace(settings, webhooks_allowed_hosts="127.0.0.1")


def _branch_from_main(repo: pygit2.Repository, name: str) -> None:
    repo.branches.local.create(name, repo.branches.local["main"].peel(pygit2.Commit))


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


class Team(msgspec.Struct):
    ana: str  # owner
    bob: str  # write collaborator
    rita: str  # reader
    out: str  # can read nothing


async def _team(client: AsyncTestClient[Any], make: Accounts, *, visibility: str = "private") -> Team:
    for login in ("ana", "bob", "rita", "out"):
        await make.user(login)
    await make.bot("demo-agent")
    ana = await make.token("ana", "repo:write", "reviews:write", "webhooks:admin")
    r = await client.post(
        "/api/v1/user/repos", json={"name": "proj", "auto_init": True, "visibility": visibility}, headers=bearer(ana)
    )
    assert r.status_code == 201, r.text
    for login, role in (("bob", "write"), ("rita", "read"), ("demo-agent", "write")):
        r = await client.put(f"{API}/collaborators/{login}", json={"role": role}, headers=bearer(ana))
        assert r.status_code == 200, r.text
    return Team(
        ana=ana,
        bob=await make.token("bob", "repo:write"),
        rita=await make.token("rita", "repo:write"),
        out=await make.token("out", "repo:write"),
    )


async def test_an_issue_is_opened_sorted_out_discussed_and_closed(
    client: AsyncTestClient[Any], make: Accounts, db: Database
) -> None:
    t = await _team(client, make)
    hook = {"url": "http://127.0.0.1:9/hook", "kind": "notify", "events": [
        "issue.opened", "issue.edited", "issue.closed", "issue.reopened", "issue.labeled", "issue.assigned",
        "comment.created", "comment.edited", "comment.deleted",
    ]}  # fmt: skip
    assert (await client.post(f"{API}/hooks", json=hook, headers=bearer(t.ana))).status_code == 201
    for name, color in (("bug", "d73a4a"), ("Needs Triage", "#FBCA04")):
        r = await client.post(f"{API}/labels", json={"name": name, "color": color}, headers=bearer(t.ana))
        assert r.status_code == 201, r.text
    r = await client.post(f"{API}/milestones", json={"title": "v1"}, headers=bearer(t.ana))
    assert r.status_code == 201 and r.json()["number"] == 1

    # The reader opens an issue: labels they send are ignored (they need the write role), as on GitHub.
    r = await client.post(
        f"{API}/issues", json={"title": "Crash on\nstart", "body": "It crashes. See #1.", "labels": ["bug"]},
        headers=bearer(t.rita),
    )  # fmt: skip
    assert r.status_code == 201, r.text
    issue = r.json()
    assert issue["number"] == 1 and issue["title"] == "Crash on start" and issue["state"] == "open"
    assert issue["labels"] == [] and issue["user"]["login"] == "rita" and issue["author_association"] == "NONE"

    # bob sorts it out: labels (any case), an assignee (a bot), the milestone.
    r = await client.patch(
        f"{API}/issues/1", json={"labels": ["BUG", "needs triage"], "assignees": ["demo-agent"], "milestone": 1},
        headers=bearer(t.bob),
    )  # fmt: skip
    assert r.status_code == 200, r.text
    got = r.json()
    assert [label["name"] for label in got["labels"]] == ["bug", "Needs Triage"]
    assert got["labels"][1]["color"] == "fbca04"
    assert [a["login"] for a in got["assignees"]] == ["demo-agent"] and got["assignees"][0]["type"] == "Bot"
    assert got["milestone"]["title"] == "v1" and got["milestone"]["open_issues"] == 1

    # The discussion: a comment, edited (the history keeps the first text), then the author closes it.
    r = await client.post(f"{API}/issues/1/comments", json={"body": "Seen on v0.9"}, headers=bearer(t.bob))
    assert r.status_code == 201, r.text
    comment = r.json()
    r = await client.patch(
        f"{API}/issues/comments/{comment['id']}", json={"body": "Seen on 0.9.1"}, headers=bearer(t.bob)
    )
    assert r.status_code == 200 and r.json()["body"] == "Seen on 0.9.1" and r.json()["edits"] == 1
    history = (await client.get(f"{API}/issues/comments/{comment['id']}/edits", headers=bearer(t.rita))).json()
    assert [h["body_before"] for h in history] == ["Seen on v0.9"]
    r = await client.patch(
        f"{API}/issues/1", json={"state": "closed", "state_reason": "not_planned"}, headers=bearer(t.rita)
    )
    assert r.status_code == 200, r.text
    assert r.json()["state"] == "closed" and r.json()["state_reason"] == "not_planned"
    assert r.json()["closed_by"]["login"] == "rita"
    r = await client.patch(f"{API}/issues/1", json={"state": "open"}, headers=bearer(t.bob))
    assert r.json()["state"] == "open" and r.json()["state_reason"] == "reopened"

    timeline = (await client.get(f"{API}/issues/1/timeline", headers=bearer(t.ana))).json()
    events = [e["event"] for e in timeline]
    # Below the write role tasks do not exist: what the assignment asked of the agent is not shown.
    seen_by_reader = (await client.get(f"{API}/issues/1/timeline", headers=bearer(t.rita))).json()
    assert [e["event"] for e in seen_by_reader] == [e for e in events if e != "trigger_refused"]
    # bob's token cannot start tasks: assigning the bot says so on the timeline and starts nothing.
    assert events == [
        "labeled", "labeled", "assigned", "trigger_refused", "milestoned", "commented", "closed", "reopened",
    ]  # fmt: skip
    assert timeline[2]["details"]["assignee"] == "demo-agent" and timeline[2]["actor"]["login"] == "bob"
    # null removes the milestone, as GitHub; a PATCH without the field leaves it.
    kept = await client.patch(f"{API}/issues/1", json={"title": "Crash on start (v1)"}, headers=bearer(t.bob))
    assert kept.json()["milestone"]["title"] == "v1"
    removed = await client.patch(f"{API}/issues/1", json={"milestone": None}, headers=bearer(t.bob))
    assert removed.status_code == 200 and removed.json()["milestone"] is None
    after = (await client.get(f"{API}/issues/1/timeline", headers=bearer(t.ana))).json()
    assert [e["event"] for e in after][-2:] == ["renamed", "demilestoned"]

    async with db.session() as s:
        actions = [a for (a,) in (await s.execute(select(AuditEvent.action).order_by(AuditEvent.id))).all()]
        types = [o.event_type for o in (await s.execute(select(WebhookOutbox).order_by(WebhookOutbox.id))).scalars()]
    for action in ("repo.issue.open", "repo.issue.labels", "repo.issue.assignees", "repo.issue.milestone",
                   "repo.issue.comment", "repo.issue.comment.edit", "repo.issue.close", "repo.issue.reopen",
                   "repo.label.create", "repo.milestone.create"):  # fmt: skip
        assert action in actions, action
    assert types == [
        "issue.opened", "issue.labeled", "issue.labeled", "issue.assigned", "comment.created", "comment.edited",
        "issue.closed", "issue.reopened", "issue.edited",
    ]  # fmt: skip


async def test_numbers_are_shared_with_pull_requests_and_the_list_filters(
    client: AsyncTestClient[Any], make: Accounts
) -> None:
    t = await _team(client, make)
    from forge.git import Identity
    from forge.git.bare import write_commit

    await client.app.state.repo_store.write(
        ("ana", "proj"), write_commit, branch="feature", files={"f.txt": "f\n"}, message="f",
        author=Identity(name="Ana", email="ana@example.org"),
    )  # fmt: skip
    await client.post(f"{API}/labels", json={"name": "bug", "color": "d73a4a"}, headers=bearer(t.ana))
    r = await client.post(f"{API}/issues", json={"title": "first", "body": "the parser"}, headers=bearer(t.ana))
    assert r.json()["number"] == 1
    r = await client.post(
        f"{API}/pulls", json={"title": "pr", "head": "feature", "base": "main"}, headers=bearer(t.ana)
    )
    assert r.status_code == 201 and r.json()["number"] == 2
    r = await client.post(
        f"{API}/issues", json={"title": "second", "body": "the lexer", "labels": ["bug"], "assignees": ["bob"]},
        headers=bearer(t.ana),
    )  # fmt: skip
    assert r.json()["number"] == 3
    await client.patch(f"{API}/issues/1", json={"state": "closed"}, headers=bearer(t.ana))

    async def numbers(query: str) -> list[int]:
        r = await client.get(f"{API}/issues?{query}", headers=bearer(t.rita))
        assert r.status_code == 200, r.text
        return [i["number"] for i in r.json()]

    assert await numbers("") == [3]
    assert await numbers("state=all") == [3, 1]
    assert await numbers("state=all&direction=asc") == [1, 3]
    assert await numbers("state=closed") == [1]
    assert await numbers("state=all&labels=BUG") == [3]
    assert await numbers("state=all&assignee=bob") == [3]
    assert await numbers("state=all&assignee=none") == [1]
    assert await numbers("state=all&creator=ana") == [3, 1]
    assert await numbers("state=all&q=PARSER") == [1]
    assert await numbers("state=all&q=100%25") == []
    assert (await client.get(f"{API}/issues/2", headers=bearer(t.rita))).json()["code"] == "issue_not_found"


async def test_who_may_do_what(client: AsyncTestClient[Any], make: Accounts) -> None:
    t = await _team(client, make)
    r = await client.post(f"{API}/issues", json={"title": "by bob"}, headers=bearer(t.bob))
    assert r.status_code == 201
    # Someone who cannot read the repository sees nothing of it.
    r = await client.post(f"{API}/issues", json={"title": "x"}, headers=bearer(t.out))
    assert r.status_code == 404 and r.json()["code"] == "repo_not_found"
    # A reader may comment, but not label, assign or close someone else's issue.
    assert (
        await client.post(f"{API}/issues/1/comments", json={"body": "+1"}, headers=bearer(t.rita))
    ).status_code == 201
    for body in ({"labels": []}, {"assignees": ["rita"]}, {"state": "closed"}, {"title": "mine now"}):
        r = await client.patch(f"{API}/issues/1", json=body, headers=bearer(t.rita))
        assert r.status_code == 403, (body, r.text)
        assert "write role" in r.json()["detail"]
    r = await client.post(f"{API}/labels", json={"name": "x", "color": "000000"}, headers=bearer(t.rita))
    assert r.status_code == 403
    # A comment is edited by its author only; deleted by its author or a repository admin.
    c = (await client.post(f"{API}/issues/1/comments", json={"body": "bob's"}, headers=bearer(t.bob))).json()
    r = await client.patch(f"{API}/issues/comments/{c['id']}", json={"body": "rita's"}, headers=bearer(t.rita))
    assert r.status_code == 403 and r.json()["code"] == "not_your_comment"
    r = await client.patch(f"{API}/issues/comments/{c['id']}", json={"body": "ana's"}, headers=bearer(t.ana))
    assert r.status_code == 403 and r.json()["code"] == "not_your_comment"
    assert (await client.delete(f"{API}/issues/comments/{c['id']}", headers=bearer(t.rita))).status_code == 403
    assert (await client.delete(f"{API}/issues/comments/{c['id']}", headers=bearer(t.ana))).status_code == 204
    assert (await client.get(f"{API}/issues/comments/{c['id']}", headers=bearer(t.ana))).status_code == 404
    # A read-only token may read but not write.
    read_only = await make.token("rita", "repo:read")
    assert (await client.get(f"{API}/issues/1", headers=bearer(read_only))).status_code == 200
    r = await client.post(f"{API}/issues/1/comments", json={"body": "x"}, headers=bearer(read_only))
    assert r.status_code == 403 and r.json()["code"] == "insufficient_scope"


async def test_bad_input_is_refused_with_its_reason(client: AsyncTestClient[Any], make: Accounts) -> None:
    t = await _team(client, make)
    big = "x" * (1024 * 1024)
    r = await client.post(f"{API}/issues", json={"title": "big", "body": big}, headers=bearer(t.ana))
    assert r.status_code == 413 and r.json()["code"] == "payload_too_large", r.text
    assert "65,536 characters" in r.json()["detail"] and "bytes" in r.json()["detail"]
    r = await client.post(f"{API}/issues", json={"title": "big", "body": "x" * 65_537}, headers=bearer(t.ana))
    assert r.status_code == 422 and "65536" in r.text, r.text
    r = await client.post(f"{API}/issues", json={"title": "   "}, headers=bearer(t.ana))
    assert r.status_code == 422
    r = await client.post(f"{API}/issues", json={"title": "t", "labels": ["nope"]}, headers=bearer(t.ana))
    assert r.status_code == 422 and r.json()["code"] == "label_not_found" and "nope" in r.json()["detail"]
    r = await client.post(f"{API}/issues", json={"title": "t", "assignees": ["out"]}, headers=bearer(t.ana))
    assert r.status_code == 422 and r.json()["code"] == "invalid_assignee"
    r = await client.post(f"{API}/labels", json={"name": "bug", "color": "red"}, headers=bearer(t.ana))
    assert r.status_code == 422
    assert (
        await client.post(f"{API}/labels", json={"name": "bug", "color": "ff0000"}, headers=bearer(t.ana))
    ).status_code == 201
    r = await client.post(f"{API}/labels", json={"name": "BUG", "color": "ff0000"}, headers=bearer(t.ana))
    assert r.status_code == 409 and r.json()["code"] == "label_exists"
    r = await client.patch(f"{API}/issues/999", json={"title": "x"}, headers=bearer(t.ana))
    assert r.status_code == 404 and r.json()["code"] == "issue_not_found"
    r = await client.get(f"{API}/issues/-1", headers=bearer(t.ana))
    assert r.status_code == 404
    assert (await client.get(f"{API}/issues/comments/abc", headers=bearer(t.ana))).status_code == 404


async def test_references_mark_the_timeline_and_fixes_closes_on_merge(
    client: AsyncTestClient[Any], make: Accounts
) -> None:
    t = await _team(client, make)
    from forge.git import Identity
    from forge.git.bare import write_commit

    for title in ("login fails", "logout fails", "docs"):
        assert (await client.post(f"{API}/issues", json={"title": title}, headers=bearer(t.ana))).status_code == 201
    r = await client.post(
        f"{API}/issues/3/comments", json={"body": "Related to #1, not `#2`.\n\n```\n#2\n```"}, headers=bearer(t.bob)
    )
    assert r.status_code == 201
    timeline = (await client.get(f"{API}/issues/1/timeline", headers=bearer(t.ana))).json()
    assert [e["event"] for e in timeline] == ["cross-referenced"]
    assert timeline[0]["details"]["source"] == {"type": "issue", "number": 3, "title": "docs"}
    assert (await client.get(f"{API}/issues/2/timeline", headers=bearer(t.ana))).json() == []

    await client.app.state.repo_store.write(("ana", "proj"), _branch_from_main, "fix")
    await client.app.state.repo_store.write(
        ("ana", "proj"), write_commit, branch="fix", files={"f.txt": "f\n"}, message="Handle logout\n\nFixes #2",
        author=Identity(name="Bob", email="bob@example.org"),
    )  # fmt: skip
    r = await client.post(
        f"{API}/pulls", json={"title": "fix login", "head": "fix", "base": "main", "body": "Closes #1"},
        headers=bearer(t.bob),
    )  # fmt: skip
    assert r.status_code == 201, r.text
    number = r.json()["number"]
    # Protected default branch: a merge needs nothing more than the write role here.
    r = await client.put(f"{API}/pulls/{number}/merge", json={"strategy": "merge"}, headers=bearer(t.ana))
    assert r.status_code == 200, r.text
    for issue in (1, 2):
        got = (await client.get(f"{API}/issues/{issue}", headers=bearer(t.ana))).json()
        assert got["state"] == "closed" and got["state_reason"] == "completed", issue
        closed = [
            e
            for e in (await client.get(f"{API}/issues/{issue}/timeline", headers=bearer(t.ana))).json()
            if e["event"] == "closed"
        ]
        assert closed[0]["details"]["pull_request"] == number
    assert (await client.get(f"{API}/issues/3", headers=bearer(t.ana))).json()["state"] == "open"
