"""The inbox over REST (GitHub's shapes): who is told of what and why (mentions, assignment,
followed threads, watching, a task waiting for its starter), never the actor nor anyone who
cannot read the repository; one thread per subject, bumped; mark read, done, all read; filters;
watching a repository; the `notifications` scope; a mention storm capped and audited."""

from typing import Any

import msgspec
import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy import select

from forge.core.settings import Settings
from forge.db.engine import Database
from forge.db.events import AccountRef, PullBranch, PullRequestMerged, TaskRef, TaskStateChanged
from forge.db.issue_payloads import IssueClosed
from forge.db.models import AuditEvent
from forge.notify.notifier import Notifier
from forge.notify.tasks import TaskPeople
from forge.repos.mentions import MENTION_CAP
from tests.support.accounts import Accounts
from tests.support.notify import BASE, REPO, Team, comment, make_team, opened


@pytest.fixture
async def team(client: AsyncTestClient[Litestar], db: Database, app: Litestar) -> Team:
    return await make_team(client, db, app)


def reasons(threads: list[dict[str, Any]]) -> list[tuple[int, str]]:
    return [(t["subject"]["number"], t["reason"]) for t in threads]


async def test_a_mention_notifies_readers_only_never_the_actor(team: Team) -> None:
    await team.publish(comment(1, "@ana @rita @eve @bob @nobody see `@ana2` mail x@ana.org", "bob"), "bob")
    [thread] = await team.inbox("ana")
    assert thread["reason"] == "mention" and thread["unread"] is True and thread["last_actor"] == "bob"
    assert thread["subject"] == {
        "title": "Thread 1", "url": f"{BASE}/api/v1/repos/ana/app/issues/1", "html_url": f"{BASE}/ana/app/issues/1",
        "type": "Issue", "number": 1,
    }  # fmt: skip
    assert thread["repository"]["full_name"] == "ana/app"
    assert thread["url"] == f"{BASE}/api/v1/notifications/threads/{thread['id']}"
    assert reasons(await team.inbox("rita")) == [(1, "mention")]
    assert await team.inbox("eve") == []  # cannot read the repository
    assert await team.inbox("bob") == []  # the actor


async def test_a_thread_is_bumped_not_duplicated_and_followers_hear_of_it(team: Team) -> None:
    await team.publish(opened(2, "It crashes, @rita", "bob", assignees=("ana",)), "bob")
    assert reasons(await team.inbox("ana")) == [(2, "assign")]
    r = await team.client.patch(f"/api/v1/notifications/{(await team.inbox('ana'))[0]['id']}", headers=team.h("ana"))
    assert r.status_code == 200 and r.json()["unread"] is False
    assert await team.inbox("ana") == []
    # rita comments: ana (assigned) and bob (the author) follow the thread; rita does not hear of herself
    await team.publish(comment(2, "Same here.", "rita"), "rita")
    [thread] = await team.inbox("ana")
    assert (thread["reason"], thread["unread"], thread["last_actor"]) == ("comment", True, "rita")
    assert reasons(await team.inbox("bob")) == [(2, "author")]
    assert reasons(await team.inbox("rita")) == [(2, "mention")]
    assert len(await team.inbox("ana", all="true")) == 1  # one thread, bumped
    # closing tells the followers (state_change; the author hears as author)
    fields = {**msgspec.structs.asdict(opened(2, "", "bob")), "state": "closed", "state_reason": "completed"}
    await team.publish(IssueClosed(**fields), "ana")
    assert reasons(await team.inbox("bob")) == [(2, "author")]
    assert reasons(await team.inbox("rita")) == [(2, "state_change")]
    assert reasons(await team.inbox("ana")) == [(2, "comment")]  # she closed it: nothing new


async def test_mark_read_done_all_and_filters(team: Team) -> None:
    await team.publish(comment(3, "@ana one", "bob"), "bob")
    await team.publish(opened(4, "two", "bob", assignees=("ana",)), "bob")
    threads = await team.inbox("ana")
    assert reasons(threads) == [(4, "assign"), (3, "mention")]
    assert reasons(await team.inbox("ana", reason="mention")) == [(3, "mention")]
    assert reasons(await team.inbox("ana", participating="true")) == [(4, "assign"), (3, "mention")]
    r = await team.client.get("/api/v1/notifications", params={"reason": "bogus"}, headers=team.h("ana"))
    assert r.status_code == 422 and "reason must be one of" in r.json()["detail"]
    done = threads[0]["id"]
    assert (await team.client.delete(f"/api/v1/notifications/threads/{done}", headers=team.h("ana"))).status_code == 204
    assert reasons(await team.inbox("ana")) == [(3, "mention")]
    r = await team.client.put("/api/v1/notifications", headers=team.h("ana"))
    assert r.status_code == 200 and r.json() == {"marked_read": 1}
    assert await team.inbox("ana") == []
    assert reasons(await team.inbox("ana", all="true")) == [(3, "mention")]  # done ones are not listed
    # another's thread is not found; a token without the scope is told which it lacks
    r = await team.client.get(f"/api/v1/notifications/{done}", headers=team.h("bob"))
    assert r.status_code == 404 and r.json()["code"] == "notification_not_found"
    narrow = await Accounts(db=team.db).token("ana", "repo:read")
    r = await team.client.get("/api/v1/notifications", headers={"Authorization": f"Bearer {narrow}"})
    assert r.status_code == 403 and r.json()["code"] == "insufficient_scope" and "'notifications'" in r.json()["detail"]
    async with team.db.session() as s:
        actions = set((await s.execute(select(AuditEvent.action).where(AuditEvent.actor_login == "ana"))).scalars())
    assert {"notifications.done", "notifications.read_all"} <= actions


async def test_watching_a_repository(team: Team) -> None:
    sub = f"{REPO}/subscription"
    r = await team.client.get(sub, headers=team.h("rita"))
    assert r.json()["level"] == "participating" and r.json()["subscribed"] is False and r.json()["created_at"] is None
    r = await team.client.put(sub, json={"subscribed": True}, headers=team.h("rita"))
    assert r.status_code == 200 and r.json()["level"] == "all" and r.json()["subscribed"] is True
    await team.publish(opened(5, "new", "bob"), "bob")
    assert reasons(await team.inbox("rita")) == [(5, "subscribed")]
    assert reasons(await team.inbox("rita", participating="true")) == []
    # ignore: nothing, not even a mention
    r = await team.client.put(sub, json={"level": "ignore"}, headers=team.h("rita"))
    assert r.json()["ignored"] is True
    await team.publish(comment(6, "@rita?", "bob"), "bob")
    assert reasons(await team.inbox("rita")) == [(5, "subscribed")]
    r = await team.client.put(sub, json={"subscribed": True, "ignored": True}, headers=team.h("rita"))
    assert r.status_code == 422 and r.json()["code"] == "invalid_subscription"
    assert (await team.client.delete(sub, headers=team.h("rita"))).status_code == 204
    assert (await team.client.get(sub, headers=team.h("rita"))).json()["level"] == "participating"
    r = await team.client.get(sub, headers=team.h("eve"))
    assert r.status_code == 404 and r.json()["code"] == "repo_not_found"


async def test_a_pull_requests_author_hears_of_its_merge(team: Team) -> None:
    await team.publish(comment(7, "Please review, @ana", "bob", pull=True), "bob")
    merged = PullRequestMerged(
        number=7, title="Thread 7", html_url=f"{BASE}/ana/app/pull/7", state="merged", draft=False,
        head=PullBranch(ref="x", sha="a" * 40), base=PullBranch(ref="main", sha="b" * 40),
        author=AccountRef(login="bob"), strategy="merge", merge_commit_sha="c" * 40,
    )  # fmt: skip
    await team.publish(merged, "ana")
    [thread] = await team.inbox("bob")
    assert (thread["reason"], thread["subject"]["type"]) == ("author", "PullRequest")
    assert reasons(await team.inbox("ana")) == [(7, "mention")]  # ana merged: not told of her own act


async def test_a_mention_storm_notifies_at_most_the_cap(team: Team, settings: Settings) -> None:
    make = Accounts(db=team.db)
    logins = [f"fan{i}" for i in range(MENTION_CAP + 5)]
    for login in logins:
        await make.user(login)
    r = await team.client.patch(REPO, json={"visibility": "public"}, headers=team.h("ana"))
    assert r.is_success, r.text
    body = " ".join(f"@{login}" for login in logins) + " " + " ".join(f"@ghost{i}" for i in range(1000))
    await team.publish(comment(8, body, "bob"), "bob")
    async with team.db.session() as s:
        from forge.db.notify_models import Notification

        count = len((await s.execute(select(Notification.id))).scalars().all())
        audit = (
            await s.execute(select(AuditEvent).where(AuditEvent.action == "notifications.mention_cap"))
        ).scalar_one()
    assert count == MENTION_CAP
    assert audit.detail == {"mentioned": len(logins) + 1000, "notified_at_most": MENTION_CAP, "dropped": 1005}


async def test_a_task_waiting_tells_its_starter(team: Team, settings: Settings) -> None:
    async def lookup(session: Any, task_uuid: str) -> TaskPeople | None:
        return TaskPeople(title="Fix the build", started_by_id=ids["rita" if task_uuid == "t-rita" else "bob"])

    async with team.db.session() as s:
        from forge.accounts.accounts import require_by_login

        ids = {login: (await require_by_login(s, login)).id for login in ("bob", "rita")}
    notifier = Notifier(settings, tasks=lookup)
    for uuid_, number in (("t-bob", 1), ("t-rita", 2)):
        from forge.db.events import Event

        event = Event(
            repo_id=team.repo_id, repository="ana/app", task=TaskRef(id=uuid_, number=number, url=f"{BASE}/t/{number}"),
            data=TaskStateChanged(from_="running", to="awaiting_review"),
        )  # fmt: skip
        async with team.db.session(write=True) as s:
            await notifier(s, event)
    [thread] = await team.inbox("bob")
    assert (thread["reason"], thread["subject"]["type"], thread["subject"]["title"]) == (
        "task",
        "Task",
        "Fix the build",
    )
    assert await team.inbox("rita") == []  # a reader does not see tasks
