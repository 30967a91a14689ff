"""The notification pages without a browser: the inbox lists a thread and marks it read and done,
the header's badge counts unread threads, Settings > Notifications keeps what was typed beside
its error and saves, and the watch control sets the level (each change audited)."""

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy import select

from forge.db.engine import Database
from forge.db.models import AuditEvent
from tests.support.accounts import PASSWORD
from tests.support.notify import REPO, Team, comment, make_team
from tests.support.web import csrf_from, sign_in


@pytest.fixture
async def team(client: AsyncTestClient[Litestar], db: Database, app: Litestar) -> Team:
    team = await make_team(client, db, app)
    assert (await sign_in(client, "ana", PASSWORD)).status_code in (302, 303)
    return team


async def test_inbox_badge_and_marks(team: Team, client: AsyncTestClient[Litestar]) -> None:
    await team.publish(comment(1, "@ana look", "bob"), "bob")
    assert 'id="inbox-count">1<' in (await client.get("/notifications/badge")).text
    page = await client.get("/notifications")
    assert "Thread 1" in page.text and "mention" in page.text
    [thread] = await team.inbox("ana")
    token = csrf_from(page.text)
    r = await client.post(f"/notifications/{thread['id']}/read", data={"csrf_token": token, "next": "/notifications"})
    assert r.status_code == 200 and "All caught up" in r.text  # followed the redirect
    assert "inbox-count" not in (await client.get("/notifications/badge")).text
    r = await client.post(f"/notifications/{thread['id']}/done", data={"csrf_token": token})
    assert "Thread 1" in (await client.get("/notifications?view=done")).text
    assert "Thread 1" not in (await client.get("/notifications?view=all")).text


async def test_settings_keep_what_was_typed_and_save(team: Team, client: AsyncTestClient[Litestar]) -> None:
    page = await client.get("/settings/notifications/")
    assert page.status_code == 200 and 'id="email-off"' in page.text
    token = csrf_from(page.text)
    r = await client.post(
        "/settings/notifications/", data={"csrf_token": token, "email": "not an address", "mention": "email"}
    )
    assert r.status_code == 422 and 'value="not an address"' in r.text and "name@example.org" in r.text
    r = await client.post(
        "/settings/notifications/",
        data={"csrf_token": token, "email": "ana@example.org", "mention": "email", "subscribed": "off"},
    )
    assert r.status_code == 200 and "Notification settings saved." in r.text and 'value="ana@example.org"' in r.text


async def test_the_watch_control(team: Team, client: AsyncTestClient[Litestar], db: Database) -> None:
    control = await client.get("/ana/app/subscription")
    assert 'value="participating" selected' in control.text
    r = await client.post("/ana/app/subscription", data={"csrf_token": csrf_from(control.text), "level": "all"})
    assert r.status_code == 200  # back on the repository's page
    assert (await client.get(f"{REPO}/subscription", headers=team.h("ana"))).json()["level"] == "all"
    r = await client.post("/ana/app/subscription", data={"csrf_token": csrf_from(control.text), "level": "loud"})
    assert r.status_code == 422
    async with db.session() as s:
        actions = list(
            (await s.execute(select(AuditEvent.action).where(AuditEvent.action.like("notifications.%")))).scalars()
        )
    assert "notifications.watch" in actions
