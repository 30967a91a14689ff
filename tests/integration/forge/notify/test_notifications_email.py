"""E-mail of notifications against a real SMTP server (aiosmtpd on 127.0.0.1): an outbox row in the
change's transaction, a message with the thread's headers and the one-click unsubscribe headers;
the server down, the row stays and is sent once when it is up (no loss, no duplicate, two mailers
never take one row); the unsubscribe link turns the thread off without signing in; the running
mailer is woken by the commit."""

import asyncio
import email
import email.policy
from collections.abc import Iterator
from datetime import timedelta
from email.message import EmailMessage
from typing import Any

import msgspec
import pytest
from aiosmtpd.controller import Controller
from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy import select

from forge.core.settings import Settings
from forge.db.engine import Database, utcnow
from forge.db.events import EventBus
from forge.db.notify_models import MailOutbox
from forge.notify import preferences
from forge.notify.mailer import Mailer
from forge.notify.notifier import Notifications
from tests.support.notify import Team, comment, make_team
from tests.support.ports import free_port
from tests.support.waiting import until

THREAD = "<ana/app/issues/1@testserver.local>"


class Inbox:
    """The SMTP server's handler: every message it accepted."""

    def __init__(self) -> None:
        self.messages: list[EmailMessage] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        parsed = email.message_from_bytes(envelope.content, policy=email.policy.default)
        self.messages.append(parsed)  # type: ignore[arg-type]
        return "250 OK"


@pytest.fixture
def smtp_port() -> int:
    return free_port()


@pytest.fixture
def settings(settings: Settings, smtp_port: int) -> Settings:
    return msgspec.structs.replace(
        settings, smtp_host="127.0.0.1", smtp_port=smtp_port, smtp_starttls=False, smtp_from="forge@example.org",
        smtp_timeout_seconds=5.0,
    )  # fmt: skip


@pytest.fixture
def smtp(smtp_port: int) -> Iterator[tuple[Inbox, Controller]]:
    handler = Inbox()
    controller = Controller(handler, hostname="127.0.0.1", port=smtp_port)
    yield handler, controller
    if getattr(controller, "_thread", None) is not None:
        controller.stop()


@pytest.fixture
async def team(client: AsyncTestClient[Litestar], db: Database, app: Litestar) -> Team:
    team = await make_team(client, db, app)
    async with db.session(write=True) as s:
        from forge.accounts.accounts import require_by_login
        from forge.db.audit import Actor

        ana = await require_by_login(s, "ana")
        await preferences.save(
            s, Actor.system("test"), ana.id, "ana@example.org", {"mention": "email", "comment": "email"}
        )
    return team


async def outbox(db: Database) -> list[MailOutbox]:
    async with db.session() as s:
        return list((await s.execute(select(MailOutbox).order_by(MailOutbox.id))).scalars())


async def test_a_mention_is_mailed_threaded_with_one_click_unsubscribe(
    team: Team, db: Database, settings: Settings, smtp: tuple[Inbox, Controller], client: AsyncTestClient[Litestar]
) -> None:
    handler, controller = smtp
    controller.start()
    await team.publish(comment(1, "@ana can you look?\n\nIt fails on `main`.", "bob"), "bob")
    [row] = await outbox(db)
    assert row.state == "pending" and row.to_addr == "ana@example.org"
    assert await Mailer(db, settings).run_once() == 1
    [msg] = handler.messages
    assert msg["To"] == "ana@example.org" and msg["From"] == "forge@example.org"
    assert msg["Subject"] == "[ana/app] Thread 1 (Issue #1)"
    assert msg["In-Reply-To"] == THREAD and msg["References"] == THREAD
    assert msg["Message-ID"].strip().startswith("<ana/app/issues/1/") and msg["Message-ID"].strip() != THREAD
    assert msg["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
    link = msg["List-Unsubscribe"].strip("<>")
    body = msg.get_content()
    assert "bob commented on issue #1" in body and "It fails on `main`." in body
    assert (
        f"Unsubscribe from this thread: {link}" in body and "http://testserver.local/ana/app/issues/1#comment-1" in body
    )
    assert (await outbox(db))[0].state == "sent"
    # one click (no session, RFC 8058's body): the thread is off for ana; its comments no longer reach her
    r = await client.post(link.removeprefix("http://testserver.local"), data={"List-Unsubscribe": "One-Click"})
    assert r.status_code == 200 and "no more notifications of issue #1" in r.text
    await team.publish(comment(1, "Any news?", "rita", comment_id=2), "rita")
    assert len(await outbox(db)) == 1
    assert [t["last_actor"] for t in await team.inbox("ana", all="true")] == ["bob"]
    r = await client.get("/notifications/unsubscribe/not-a-token")
    assert r.status_code == 404


async def test_the_server_down_the_row_waits_then_goes_once(
    team: Team, db: Database, settings: Settings, smtp: tuple[Inbox, Controller]
) -> None:
    handler, controller = smtp
    await team.publish(comment(1, "@ana ping", "bob"), "bob")
    mailer, other = Mailer(db, settings), Mailer(db, settings)
    assert await mailer.run_once() == 1  # nobody listens: a temporary failure
    [row] = await outbox(db)
    assert (row.state, row.attempts, row.lease_until) == ("pending", 1, None)
    assert "cannot connect" in row.last_error and row.next_attempt_at > utcnow()
    assert await mailer.run_once() == 0  # not due yet
    controller.start()
    later = utcnow() + timedelta(hours=1)
    claimed = await mailer.claim(later)
    assert len(claimed) == 1 and await other.claim(later) == []  # leased: the other mailer cannot take it
    await mailer.record(await asyncio.to_thread(mailer.send_batch, claimed))
    assert await other.run_once(later + timedelta(hours=1)) == 0
    assert len(handler.messages) == 1
    [row] = await outbox(db)
    assert (row.state, row.attempts) == ("sent", 1)


async def test_mailers_of_several_processes_send_each_message_once(
    team: Team, db: Database, settings: Settings, smtp: tuple[Inbox, Controller]
) -> None:
    """Three mailers with their own connection pools (three processes against one database) send
    together: every outbox row reaches the server exactly once (the lease: `FOR UPDATE SKIP
    LOCKED` on PostgreSQL, one writer at a time on SQLite)."""
    handler, controller = smtp
    controller.start()
    for number in range(1, 7):
        await team.publish(comment(number, f"@ana look at {number}", "bob", comment_id=number), "bob")
    handles = [Database(settings.effective_database_url) for _ in range(3)]
    try:
        sent = await asyncio.gather(*(Mailer(h, settings).run_once() for h in handles))
        again = await asyncio.gather(*(Mailer(h, settings).run_once() for h in handles))
    finally:
        for h in handles:
            await h.dispose()
    assert sum(sent) == 6 and sum(again) == 0
    subjects = sorted(m["Subject"] for m in handler.messages)
    assert subjects == sorted(f"[ana/app] Thread {n} (Issue #{n})" for n in range(1, 7))
    assert {row.state for row in await outbox(db)} == {"sent"}


async def test_the_running_mailer_is_woken_by_the_commit(
    team: Team, db: Database, settings: Settings, smtp: tuple[Inbox, Controller]
) -> None:
    handler, controller = smtp
    controller.start()
    notifications = Notifications(db, settings)
    notifications.mailer.poll_seconds = 3600.0  # only the wake-up can send it in time
    bus = EventBus()
    bus.subscribe(notifications.notifier)
    team.app.state.bus = bus
    await notifications.start()
    try:
        await team.publish(comment(1, "@ana now", "bob"), "bob")
        await until(lambda: len(handler.messages) == 1, timeout=20, what="the e-mail to arrive")
    finally:
        await notifications.stop()
