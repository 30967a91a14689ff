"""Catch-up after an endpoint's recovery: when an endpoint that was failing answers again (any
successful notification to it, a ping included), its pending rows waiting on the retry schedule
are made due at once, in one statement, so a short outage does not turn into a backlog that drains
at the pace of the schedule (minutes to hours). Order per task still holds: the claim rule
(`webhooks.delivery.outbox_store`) sends a row only after the older rows of its task.

Flapping (one success, then errors again) cannot become a hot loop: a row is caught up at most
once between two scheduled attempts. A failed catch-up attempt is an attempt like any other (its
next retry comes from the schedule), and the next recovery skips that row until the schedule has
tried it again."""

from datetime import datetime
from typing import Any, cast

from sqlalchemy import Table, and_, bindparam, or_, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from forge.db.engine import UTCDateTime
from webhooks.core.models import WebhookOutbox

OUTBOX = cast(Table, WebhookOutbox.__table__)


def _catch_up_statement(pg: bool) -> Any:
    o = OUTBOX.c
    now = bindparam("_now", type_=UTCDateTime())
    waiting = and_(
        o.endpoint_id.in_(bindparam("_ids", expanding=True)),
        o.state == "pending",
        o.next_attempt_at > now,
        # Not again for a row whose last attempt was the previous catch-up (flapping).
        or_(o.caught_up_at_attempt.is_(None), o.attempts > o.caught_up_at_attempt + 1),
    )
    if pg:
        # Rows locked by another deliverer's recording transaction are skipped, not waited for:
        # two recordings catching up each other's rows would otherwise deadlock.
        waiting = o.id.in_(select(o.id).where(waiting).with_for_update(skip_locked=True))
    return update(OUTBOX).where(waiting).values(next_attempt_at=now, caught_up_at_attempt=o.attempts)


_CATCH_UP = {pg: _catch_up_statement(pg) for pg in (False, True)}


async def catch_up(conn: AsyncConnection, endpoint_ids: set[int], now: datetime) -> int:
    """Make the waiting rows of the recovered `endpoint_ids` due at `now` (one UPDATE, in the
    caller's transaction); returns how many rows moved."""
    if not endpoint_ids:
        return 0
    pg = conn.dialect.name == "postgresql"
    result = await conn.execute(_CATCH_UP[pg], {"_ids": sorted(endpoint_ids), "_now": now})
    return int(getattr(result, "rowcount", 0) or 0)
