"""What readers and outsiders must not get from issues, mentions and notifications: a task's
question, number and states on an issue's timeline (tasks do not exist below the write role), a
person mailed again and again by editing a mention in and out, the inbox of a repository one lost
access to."""

from typing import Any

import msgspec
import pytest
from litestar.testing import AsyncTestClient
from sqlalchemy import select

from forge.core.settings import Settings
from forge.db.engine import Database
from forge.db.events import Event, TaskStateChanged
from forge.db.models import Account
from forge.db.notify_models import MailOutbox
from forge.db.payload_base import TaskRef
from forge.notify import preferences
from tasks.core.models import Task
from tasks.services import agent_triggers
from tests.support.accounts import Accounts

API = "/api/v1/repos/ana/proj"


@pytest.fixture
def settings(settings: Settings) -> Settings:
    # A model for the builtin runtime (no worker runs it) and an SMTP host (nothing listens: the
    # outbox rows are what is counted).
    return msgspec.structs.replace(
        settings, model_base_url="http://127.0.0.1:9/v1", model_name="scripted",
        smtp_host="127.0.0.1", smtp_port=9, smtp_starttls=False, smtp_from="forge@example.org",
        smtp_timeout_seconds=1.0,
    )  # fmt: skip


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


class Team(msgspec.Struct):
    ana: str  # owner
    bob: str  # write collaborator
    rita: str  # reader


async def _team(client: AsyncTestClient[Any], make: Accounts, *, visibility: str = "private") -> Team:
    for login in ("ana", "bob", "rita"):
        await make.user(login)
    await make.bot("demo-agent")
    ana = await make.token("ana", "repo:write", "tasks:write", "notifications")
    r = await client.post(
        "/api/v1/user/repos", json={"name": "proj", "auto_init": True, "visibility": visibility}, headers=bearer(ana)
    )
    assert r.status_code == 201, r.text
    for login, role in (("bob", "write"), ("rita", "read"), ("demo-agent", "write")):
        assert (await client.put(f"{API}/collaborators/{login}", json={"role": role}, headers=bearer(ana))).is_success
    return Team(
        ana=ana,
        bob=await make.token("bob", "repo:write", "tasks:write", "notifications"),
        rita=await make.token("rita", "repo:write", "notifications"),
    )


# a triggered task's question (agent-written text, up to 2,000 characters), its number,
# states and refusal reasons are put on the issue's timeline, which every reader of the issue sees
# (REST timeline and the page), while below the write role tasks are 404 everywhere
# (docs/security.md, "A reader learning about tasks"). tasks/services/agent_triggers.py `on_event`,
# forge/repos/issue_comments.py `timeline`, forge/templates/repos/issue.html (task_state).
async def test_a_tasks_question_on_an_issue_timeline_is_not_shown_to_readers(
    client: AsyncTestClient[Any], make: Accounts, db: Database
) -> None:
    t = await _team(client, make)
    assert (await client.post(f"{API}/issues", json={"title": "Crash"}, headers=bearer(t.ana))).status_code == 201
    r = await client.post(f"{API}/issues/1/assignees", json={"assignees": ["demo-agent"]}, headers=bearer(t.ana))
    assert r.status_code == 201, r.text
    secret = "the deploy key in /workspace/.env reads AKIA-EXAMPLE: may I use it?"
    async with db.session(write=True) as s:
        task = (await s.execute(select(Task))).scalar_one()
        task.state, task.question = "blocked", secret
        event = Event(
            repo_id=task.repo_id, task=TaskRef(id=task.uuid, number=task.number),
            data=TaskStateChanged(from_="running", to="blocked"),
        )  # fmt: skip
        await agent_triggers.on_event(s, event)  # what the bus does when the task asks
    # The task itself is hidden from the reader ...
    assert (await client.get(f"{API}/tasks/{task.number}", headers=bearer(t.rita))).status_code == 404
    # ... but the issue's timeline tells her the task, its state and the agent's question.
    timeline = (await client.get(f"{API}/issues/1/timeline", headers=bearer(t.rita))).json()
    assert secret not in str(timeline)
    leaked = [e["event"] for e in timeline if e["event"] in ("task", "task_state", "trigger_refused")]
    assert leaked == [], leaked


# mention storms through edits. An edit notifies the mentions "new" relative to the text
# it replaced only (forge/notify/activity.py `_new_mentions`), so a reader who toggles a mention in
# and out of their own comment notifies (and e-mails) the same person on every other edit, with no
# rate limit: one comment mails a victim as often as its author cares to edit it.
async def test_toggling_a_mention_by_edits_mails_nobody_again(
    client: AsyncTestClient[Any], make: Accounts, db: Database
) -> None:
    t = await _team(client, make)
    async with db.session(write=True) as s:
        from forge.db.audit import Actor

        bob = (await s.execute(select(Account).where(Account.login_key == "bob"))).scalar_one()
        await preferences.save(s, Actor.system("test"), bob.id, "bob@example.org", {"mention": "email"})
    r = await client.post(f"{API}/issues", json={"title": "Question"}, headers=bearer(t.rita))
    assert r.status_code == 201, r.text
    r = await client.post(f"{API}/issues/1/comments", json={"body": "@bob look"}, headers=bearer(t.rita))
    assert r.status_code == 201, r.text
    cid = r.json()["id"]
    for n in range(10):
        body = "look" if n % 2 == 0 else "@bob look"
        r = await client.patch(f"{API}/issues/comments/{cid}", json={"body": body}, headers=bearer(t.rita))
        assert r.status_code == 200, r.text
    async with db.session() as s:
        mails = list((await s.execute(select(MailOutbox).where(MailOutbox.to_addr == "bob@example.org"))).scalars())
    # One mention, one e-mail (6 are written: the comment and every edit that put the mention back).
    assert len(mails) <= 1, len(mails)


# the inbox keeps listing threads of a repository the person can no longer read (its
# full name, the subjects' numbers and titles), over REST and on the page: forge/notify/inbox.py
# `list_for` and `get` filter by account only, never by current access.
async def test_notifications_of_a_repository_one_lost_access_to_are_not_shown(
    client: AsyncTestClient[Any], make: Accounts
) -> None:
    t = await _team(client, make)
    title = "Acquisition of Example Corp: draft terms"
    r = await client.post(f"{API}/issues", json={"title": title, "body": "@bob please review"}, headers=bearer(t.ana))
    assert r.status_code == 201, r.text
    found = (await client.get("/api/v1/notifications", headers=bearer(t.bob))).json()
    assert [n["subject"]["title"] for n in found] == [title]
    r = await client.request("DELETE", f"{API}/collaborators/bob", headers=bearer(t.ana))
    assert r.is_success, r.text
    assert (await client.get(API, headers=bearer(t.bob))).status_code == 404  # the repository is gone for bob
    found = (await client.get("/api/v1/notifications", params={"all": "true"}, headers=bearer(t.bob))).json()
    assert found == [], found
    r = await client.get(f"/api/v1/notifications/threads/{found[0]['id'] if found else 1}", headers=bearer(t.bob))
    assert r.status_code == 404, r.text
