"""The durable notification outbox, writing side: `OutboxWriter` (an `EventBus` subscriber) adds
one row per subscribed endpoint inside the transaction of the change, and `wake_after_commit`
wakes the deliverer once that transaction commits. Claiming and recording rows is
`webhooks.delivery.outbox_store`; the sending loop `webhooks.delivery.deliverer`; the retry schedule
`webhooks.delivery.schedule`.

Delivery is at least once. A row is claimed with a lease (`FOR UPDATE SKIP LOCKED` on PostgreSQL,
`BEGIN IMMEDIATE` on SQLite); if its deliverer dies, the lease runs out and another one delivers
it again, with the same `webhook-id`/`wid`. Rows of one endpoint and one task (else repository)
go out in order: a row is due only when no older row of the same key is pending.
"""

from collections.abc import Callable
from typing import Any

from sqlalchemy import event, or_, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.sql.elements import ColumnElement

from forge.db.events import Event
from webhooks.core import envelope
from webhooks.core.config import WebhooksConfig
from webhooks.core.models import WebhookEndpoint, WebhookOutbox
from webhooks.sdk.protocol import NOTIFY_EVENTS


def order_key(event: Event) -> str:
    if event.task is not None:
        return f"task:{event.task.id}"
    if event.repo_uuid:
        return f"repo:{event.repo_uuid}"
    return "instance"


def enqueue(
    session: AsyncSession,
    cfg: WebhooksConfig,
    endpoint_id: int,
    *,
    wid: str,
    event_type: str,
    subject: str,
    body: bytes,
    order_key: str,
    manual: bool,
) -> WebhookOutbox:
    now = cfg.clock()
    row = WebhookOutbox(
        endpoint_id=endpoint_id,
        wid=wid,
        event_type=event_type,
        subject=subject,
        order_key=order_key,
        body=body,
        state="pending",
        attempts=0,
        next_attempt_at=now,
        manual=manual,
        created_at=now,
    )
    session.add(row)
    return row


class OutboxWriter:
    """EventBus subscriber: one outbox row per subscribed active notify endpoint, in the
    transaction of the change. After that transaction commits, the deliverer is woken."""

    def __init__(self, cfg: WebhooksConfig, wake: Callable[[], None] | None = None) -> None:
        self.cfg = cfg
        self.wake = wake

    async def __call__(self, session: AsyncSession, event: Event) -> None:
        if event.type not in NOTIFY_EVENTS:
            return
        scope: ColumnElement[bool] = WebhookEndpoint.repo_id.is_(None)
        if event.repo_id is not None:
            scope = or_(scope, WebhookEndpoint.repo_id == event.repo_id)
        stmt = (
            select(WebhookEndpoint.id, WebhookEndpoint.events)
            .where(WebhookEndpoint.kind == "notify", WebhookEndpoint.active.is_(True), scope)
            .order_by(WebhookEndpoint.id)
        )
        targets = [eid for eid, events in (await session.execute(stmt)).all() if event.type in (events or [])]
        if not targets:
            return
        body, subject = envelope.for_event(event, self.cfg.instance_id)
        key = order_key(event)
        for endpoint_id in targets:
            enqueue(
                session,
                self.cfg,
                endpoint_id,
                wid=event.id,
                event_type=event.type,
                subject=subject,
                body=body,
                order_key=key,
                manual=False,
            )
        if self.wake is not None:
            wake_after_commit(session, self.wake)


def wake_after_commit(session: AsyncSession, wake: Callable[[], None]) -> None:
    """Call `wake` once the session's current transaction commits (once per transaction)."""
    if session.info.get("webhooks_wake"):
        return
    session.info["webhooks_wake"] = True

    def _after_commit(sync_session: Any) -> None:
        sync_session.info.pop("webhooks_wake", None)
        wake()

    event.listen(session.sync_session, "after_commit", _after_commit, once=True)
