"""The outbox store's statements, built once (Core: no ORM layer per execution): claiming due
rows under a lease, reading the state of rows being recorded, recording attempts, endpoint health."""

from typing import Any, cast

from sqlalchemy import Integer, Table, bindparam, exists, func, insert, or_, select, update

from forge.db.engine import UTCDateTime
from webhooks.core.models import DELIVERIES, WebhookEndpoint, WebhookOutbox

OUTBOX = cast(Table, WebhookOutbox.__table__)
ENDPOINTS = cast(Table, WebhookEndpoint.__table__)
OWNED_UPDATE = (
    update(OUTBOX)
    .where(OUTBOX.c.id == bindparam("_id"))
    .values(
        state=bindparam("_state"),
        attempts=bindparam("_attempts"),
        lease_until=None,
        claim_token=None,
        last_status=bindparam("_status"),
        last_error=bindparam("_error"),
        finished_at=bindparam("_finished", type_=UTCDateTime()),
        next_attempt_at=func.coalesce(bindparam("_next", type_=UTCDateTime()), OUTBOX.c.next_attempt_at),
    )
)
FINISHED_UPDATE = (
    update(OUTBOX)
    .where(OUTBOX.c.id == bindparam("_id"), OUTBOX.c.state == "pending")
    .values(state="delivered", finished_at=bindparam("_finished", type_=UTCDateTime()))
)

LOG_INSERT = insert(DELIVERIES)
LEASE_UPDATE = (
    update(OUTBOX)
    .where(OUTBOX.c.id.in_(bindparam("_ids", expanding=True)))
    .values(lease_until=bindparam("_until", type_=UTCDateTime()), claim_token=bindparam("_token"))
)
SUCCESS_UPDATE = (
    update(ENDPOINTS)
    .where(ENDPOINTS.c.id.in_(bindparam("_ids", expanding=True)))
    .values(failing_since=None, last_success_at=bindparam("_now", type_=UTCDateTime()))
)


def blocked(rows: Any, older: Any) -> Any:
    """An older row of the same endpoint and order key is still pending (`rows` and `older`: the
    columns of the outbox table and of an alias of it)."""
    return exists().where(
        older.endpoint_id == rows.endpoint_id,
        older.order_key == rows.order_key,
        older.state == "pending",
        older.id < rows.id,
    )


def claim_statement(pg: bool) -> Any:
    """Due rows with their endpoint's delivery fields, oldest first (Core, built once: parameters
    `_now` and `_limit`)."""
    now = bindparam("_now", type_=UTCDateTime())
    o, e = OUTBOX.c, ENDPOINTS.c
    stmt = (
        select(
            o.id,
            o.wid,
            o.event_type,
            o.subject,
            o.body,
            o.attempts,
            o.manual,
            e.id,
            e.url,
            e.kind,
            e.secret_kid,
            e.secret_enc,
            e.second_kid,
            e.second_enc,
        )
        .select_from(OUTBOX.join(ENDPOINTS, e.id == o.endpoint_id))
        .where(
            o.state == "pending",
            o.next_attempt_at <= now,
            or_(o.lease_until.is_(None), o.lease_until < now),
            e.active.is_(True),
            ~blocked(o, OUTBOX.alias("older").c),
        )
        .order_by(o.id)
        .limit(bindparam("_limit", type_=Integer()))
    )
    return stmt.with_for_update(skip_locked=True, of=OUTBOX) if pg else stmt


def state_statement(pg: bool) -> Any:
    """The state and claim of rows being recorded, with their endpoint's `failing_since`."""
    stmt = (
        select(OUTBOX.c.id, OUTBOX.c.state, OUTBOX.c.claim_token, ENDPOINTS.c.id, ENDPOINTS.c.failing_since)
        .join(ENDPOINTS, ENDPOINTS.c.id == OUTBOX.c.endpoint_id)
        .where(OUTBOX.c.id.in_(bindparam("_ids", expanding=True)))
    )
    return stmt.with_for_update(of=OUTBOX) if pg else stmt


CLAIM = {pg: claim_statement(pg) for pg in (False, True)}
STATE = {pg: state_statement(pg) for pg in (False, True)}
