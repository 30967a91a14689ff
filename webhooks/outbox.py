"""The durable notification outbox: the writer (an `EventBus` subscriber, inside the transaction
of the change) and the rows' store (`OutboxStore`: claims due rows, records every attempt). The
loop that sends them is `webhooks.deliverer.Deliverer` (also importable from here).

Delivery is at least once. A row is claimed with a lease (`FOR UPDATE SKIP LOCKED` on PostgreSQL,
`BEGIN IMMEDIATE` on SQLite); if its deliverer dies, the lease runs out and another one delivers
it again, with the same `webhook-id`/`wid`. Rows of one endpoint and one task (else repository)
go out in order: a row is due only when no older row of the same key is pending.

Schedule after the first attempt: 5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 14 h, 20 h, 24 h, each
with up to +20 % jitter and never early; `Retry-After` is honoured within [base, 2 x base]. Then
the row is `failed`. `410 Gone` disables the endpoint; so does failing for 5 days (with a notice).
"""

import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Any, cast

import structlog
from sqlalchemy import (
    Integer,
    Table,
    and_,
    bindparam,
    delete,
    event,
    exists,
    func,
    insert,
    or_,
    select,
    update,
)
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.sql.elements import ColumnElement

from forge import audit
from forge.audit import Actor
from forge.db import Database, UTCDateTime
from forge.events import Event
from webhooks import envelope, metrics
from webhooks.config import WebhooksConfig, unseal
from webhooks.logwriter import DELIVERIES
from webhooks.models import WebhookDelivery, WebhookEndpoint, WebhookOutbox
from webhooks.protocol import NOTIFY_EVENTS
from webhooks.signing import SigningKey

log = structlog.get_logger("forgehand.webhooks")

RETRY_SCHEDULE: tuple[int, ...] = (5, 300, 1800, 7200, 18000, 36000, 50400, 72000, 86400)
MAX_ATTEMPTS = 1 + len(RETRY_SCHEDULE)
AUTO_DISABLE_AFTER = timedelta(days=5)
CONNECT_TIMEOUT = 5.0
TOTAL_TIMEOUT = 15.0
LOG_RESPONSE_BYTES = 64 * 1024
LEASE = timedelta(seconds=60)
LEASE_MARGIN = timedelta(seconds=TOTAL_TIMEOUT + 5)  # lease left for an attempt to start
KEEP_FINISHED = timedelta(days=7)
KEEP_LOG = timedelta(days=30)
SYSTEM = Actor.system("webhooks")


def retry_delay(attempts_done: int, retry_after: float | None, rng: random.Random) -> float | None:
    """Seconds until the next attempt after `attempts_done` failed ones; None when out of tries."""
    if attempts_done < 1 or attempts_done > len(RETRY_SCHEDULE):
        return None
    base = float(RETRY_SCHEDULE[attempts_done - 1])
    if retry_after is not None:
        return min(max(retry_after, base), 2 * base)
    return base * (1.0 + 0.2 * rng.random())


def parse_retry_after(value: str | None, now: datetime) -> float | None:
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, (when - now).total_seconds())


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


@dataclass
class Claimed:
    outbox_id: int
    token: str
    endpoint_id: int
    url: str
    kind: str
    keys: list[SigningKey]
    wid: str
    event_type: str
    subject: str
    body: bytes
    attempts: int  # before this one
    manual: bool
    lease_until: datetime | None = None  # when the claim runs out (another deliverer may take the row)


@dataclass
class Attempt:
    result: str  # ok | http_error | timeout | connection_error
    status: int | None
    error: str
    headers: list[tuple[str, str]]
    jti: str
    request_headers: list[list[str]]
    response_headers: list[tuple[str, str]]
    response_body: bytes
    truncated: bool
    started_at: datetime
    duration_ms: int
    retry_after: float | None


OUTBOX = cast(Table, WebhookOutbox.__table__)
ENDPOINTS = cast(Table, WebhookEndpoint.__table__)
_OWNED_UPDATE = (
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
_FINISHED_UPDATE = (
    update(OUTBOX)
    .where(OUTBOX.c.id == bindparam("_id"), OUTBOX.c.state == "pending")
    .values(state="delivered", finished_at=bindparam("_finished", type_=UTCDateTime()))
)

_LOG_INSERT = insert(DELIVERIES)
_LEASE_UPDATE = (
    update(OUTBOX)
    .where(OUTBOX.c.id.in_(bindparam("_ids", expanding=True)))
    .values(lease_until=bindparam("_until", type_=UTCDateTime()), claim_token=bindparam("_token"))
)
_SUCCESS_UPDATE = (
    update(ENDPOINTS)
    .where(ENDPOINTS.c.id.in_(bindparam("_ids", expanding=True)))
    .values(failing_since=None, last_success_at=bindparam("_now", type_=UTCDateTime()))
)
HEALTH_STAMP_EVERY = timedelta(seconds=1)
_NEVER = datetime.min.replace(tzinfo=UTC)


def _blocked(older: Any) -> Any:
    """An older row of the same endpoint and order key is still pending."""
    return exists().where(
        older.endpoint_id == WebhookOutbox.endpoint_id,
        older.order_key == WebhookOutbox.order_key,
        older.state == "pending",
        older.id < WebhookOutbox.id,
    )


def _claim_statement(pg: bool) -> Any:
    """Due rows with their endpoint's delivery fields, oldest first (Core, built once: parameters
    `_now` and `_limit`)."""
    now = bindparam("_now", type_=UTCDateTime())
    o, e, older = OUTBOX.c, ENDPOINTS.c, OUTBOX.alias("older").c
    blocked = exists().where(
        older.endpoint_id == o.endpoint_id, older.order_key == o.order_key, older.state == "pending", older.id < o.id
    )
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
            ~blocked,
        )
        .order_by(o.id)
        .limit(bindparam("_limit", type_=Integer()))
    )
    return stmt.with_for_update(skip_locked=True, of=OUTBOX) if pg else stmt


def _state_statement(pg: bool) -> Any:
    """The state and claim of rows being recorded, with their endpoint's `failing_since`."""
    stmt = (
        select(OUTBOX.c.id, OUTBOX.c.state, OUTBOX.c.claim_token, ENDPOINTS.c.id, ENDPOINTS.c.failing_since)
        .join(ENDPOINTS, ENDPOINTS.c.id == OUTBOX.c.endpoint_id)
        .where(OUTBOX.c.id.in_(bindparam("_ids", expanding=True)))
    )
    return stmt.with_for_update(of=OUTBOX) if pg else stmt


_CLAIM = {pg: _claim_statement(pg) for pg in (False, True)}
_STATE = {pg: _state_statement(pg) for pg in (False, True)}


def _log_values(c: "Claimed", a: "Attempt", outbox_id: int | None) -> dict[str, Any]:
    return {
        "endpoint_id": c.endpoint_id,
        "outbox_id": outbox_id,
        "wid": c.wid,
        "jti": a.jti,
        "kind": "policy" if c.event_type not in NOTIFY_EVENTS else "notify",
        "event_type": c.event_type,
        "attempt": c.attempts + 1,
        "url": c.url,
        "request_headers": a.request_headers,
        "request_body": c.body,
        "response_status": a.status,
        "response_headers": [list(h) for h in a.response_headers],
        "response_body": a.response_body,
        "response_truncated": a.truncated,
        "duration_ms": a.duration_ms,
        "result": a.result,
        "error": a.error,
        "started_at": a.started_at,
    }


class OutboxStore:
    """Claims due outbox rows and records attempts, in a few statements per batch; the sending
    loop (`webhooks.deliverer.Deliverer`) builds on it."""

    def __init__(
        self,
        db: Database,
        cfg: WebhooksConfig,
        *,
        rng: random.Random | None = None,
        lease: timedelta = LEASE,
        batch: int | None = None,
    ) -> None:
        self.db = db
        self.cfg = cfg
        self.rng = rng or random.Random()
        self.lease = lease
        self.batch = batch or max(1, cfg.delivery_concurrency * 2)
        self._key_cache: dict[tuple[str, str, str | None, str | None], list[SigningKey]] = {}
        self._stamped: dict[int, datetime] = {}  # endpoint id -> last_success_at written by this store

    @property
    def _pg(self) -> bool:
        return self.db.engine.dialect.name == "postgresql"

    # -- claiming ------------------------------------------------------------------------------

    async def claim(self, limit: int | None = None) -> list[Claimed]:
        """Lease up to `limit` (default: the batch size) due rows, oldest first, at most one per
        endpoint and order key (a row is due only when no older row of its key is pending).
        One SELECT and one UPDATE in one write transaction, whatever the number of rows."""
        now = self.cfg.clock()
        async with self.db.session(write=True) as session:
            return await self._claim(session, limit or self.batch, now)

    async def _claim(self, session: AsyncSession, limit: int, now: datetime) -> list[Claimed]:
        token = str(uuid.uuid4())
        conn = await session.connection()  # Core statements: no ORM layer per execution
        rows = (await conn.execute(_CLAIM[self._pg], {"_now": now, "_limit": max(1, limit)})).all()
        if not rows:
            return []
        await conn.execute(_LEASE_UPDATE, {"_ids": [r[0] for r in rows], "_until": now + self.lease, "_token": token})
        return [
            Claimed(
                outbox_id=oid,
                token=token,
                endpoint_id=eid,
                url=url,
                kind=kind,
                keys=self._keys(kid, enc, kid2, enc2),
                wid=wid,
                event_type=event_type,
                subject=subject,
                body=bytes(body),
                attempts=attempts,
                manual=manual,
                lease_until=now + self.lease,
            )
            for (oid, wid, event_type, subject, body, attempts, manual, eid, url, kind, kid, enc, kid2, enc2) in rows
        ]

    def _keys(self, kid: str, enc: str, kid2: str | None, enc2: str | None) -> list[SigningKey]:
        """Every stored secret, current first, decrypted once per secret (keyed by the ciphertext,
        so a rotation is a new key here by construction)."""
        cache_key = (kid, enc, kid2, enc2)
        keys = self._key_cache.get(cache_key)
        if keys is None:
            keys = [SigningKey(kid, unseal(self.cfg.box, enc))]
            if kid2 and enc2:
                keys.append(SigningKey(kid2, unseal(self.cfg.box, enc2)))
            if len(self._key_cache) >= 1024:
                self._key_cache.clear()
            self._key_cache[cache_key] = keys
        return keys

    # -- recording -----------------------------------------------------------------------------

    async def record(self, c: Claimed, a: Attempt) -> None:
        await self.record_many([(c, a)])

    async def record_many(self, done: list[tuple[Claimed, Attempt]]) -> None:
        """Record attempts (log rows, outbox state, endpoint health) in one write transaction of a
        handful of statements, whatever the number of attempts: one commit per batch instead of one
        per delivery. A crash before it leaves the rows leased; they are delivered again after the
        lease, with the same webhook-id."""
        if not done:
            return
        now = self.cfg.clock()
        self._count(done)
        async with self.db.session(write=True) as session:
            await self._record(session, done, now)

    async def record_and_claim(self, done: list[tuple[Claimed, Attempt]], limit: int) -> list[Claimed]:
        """`record_many(done)` then `claim(limit)` (when `limit` > 0), in one write transaction:
        the loop's one commit per turn. The claim sees the rows just recorded, so the next row of
        a task whose previous one was just delivered can go at once."""
        now = self.cfg.clock()
        self._count(done)
        async with self.db.session(write=True) as session:
            if done:
                await self._record(session, done, now)
            return await self._claim(session, limit, now) if limit > 0 else []

    @staticmethod
    def _count(done: list[tuple[Claimed, Attempt]]) -> None:
        for c, a in done:
            metrics.DELIVERIES.labels(event=c.event_type, result=a.result).inc()
            metrics.DELIVERY_SECONDS.labels(event=c.event_type).observe(a.duration_ms / 1000)

    async def _record(self, session: AsyncSession, done: list[tuple[Claimed, Attempt]], now: datetime) -> None:
        conn = await session.connection()  # Core statements: no ORM layer per execution
        found_rows = await conn.execute(_STATE[self._pg], {"_ids": [c.outbox_id for c, _ in done]})
        rows: dict[int, tuple[str, str | None]] = {}
        failing: set[int] = set()  # endpoints whose failing_since is set (read under the write lock)
        for oid, state, token, endpoint_id, failing_since in found_rows.all():
            rows[oid] = (state, token)
            if failing_since is not None:
                failing.add(endpoint_id)
        if len(rows) < len({c.outbox_id for c, _ in done}):
            # Rows go with their endpoint: an endpoint deleted while the attempt was in flight
            # took its log with it (an attempt of a row that is gone otherwise is still logged).
            endpoint_ids = {c.endpoint_id for c, _ in done}
            found = await session.execute(select(ENDPOINTS.c.id).where(ENDPOINTS.c.id.in_(endpoint_ids)))
            alive = set(found.scalars())
            done = [(c, a) for c, a in done if c.endpoint_id in alive]
            if not done:
                return
        owned: list[dict[str, Any]] = []
        finished_elsewhere: list[dict[str, Any]] = []
        for c, a in done:
            state, token = rows.get(c.outbox_id, (None, None))
            if state != "pending":
                continue
            if token != c.token:
                # Re-claimed after our lease ran out: only a success is ours to state.
                if a.result == "ok":
                    finished_elsewhere.append({"_id": c.outbox_id, "_finished": now})
                continue
            values: dict[str, Any] = {
                "_id": c.outbox_id,
                "_state": "pending",
                "_attempts": c.attempts + 1,
                "_status": a.status,
                "_error": a.result,
                "_finished": None,
                "_next": None,
            }
            if a.result == "ok":
                values["_state"], values["_finished"] = "delivered", now
            else:
                delay = None if c.manual else retry_delay(c.attempts + 1, a.retry_after, self.rng)
                if delay is None:
                    values["_state"], values["_finished"] = "failed", now
                else:
                    # Rounded up so that the jittered time is never early.
                    values["_next"] = now + timedelta(seconds=delay + 0.001)
            owned.append(values)
        logged = [_log_values(c, a, c.outbox_id if c.outbox_id in rows else None) for c, a in done]
        await conn.execute(_LOG_INSERT, logged)
        if owned:
            await conn.execute(_OWNED_UPDATE, owned)
        if finished_elsewhere:
            await conn.execute(_FINISHED_UPDATE, finished_elsewhere)
        # Endpoint health: failures first (they may disable an endpoint and write audit rows),
        # then any success of this batch clears `failing_since`.
        failed = [(c, a) for c, a in done if a.result != "ok"]
        for c, a in failed:
            endpoint = await session.get(WebhookEndpoint, c.endpoint_id)
            if endpoint is not None:
                self._health(session, endpoint, a, now)
        if failed:
            await session.flush()
        # A success clears `failing_since` and stamps `last_success_at`; skipped for an endpoint
        # that is not failing and whose stamp this store wrote less than `HEALTH_STAMP_EVERY` ago
        # (by the deliverer's clock): `last_success_at` then lags by at most that much.
        failed_ids = {c.endpoint_id for c, _ in failed}
        succeeded = {
            c.endpoint_id
            for c, a in done
            if a.result == "ok"
            and (
                c.endpoint_id in failing
                or c.endpoint_id in failed_ids
                or not (timedelta(0) <= now - self._stamped.get(c.endpoint_id, _NEVER) < HEALTH_STAMP_EVERY)
            )
        }
        if succeeded:
            await conn.execute(_SUCCESS_UPDATE, {"_ids": list(succeeded), "_now": now})
            for endpoint_id in succeeded:
                self._stamped[endpoint_id] = now
        for endpoint_id in failed_ids - succeeded:
            self._stamped.pop(endpoint_id, None)

    def _health(self, session: AsyncSession, endpoint: WebhookEndpoint, a: Attempt, now: datetime) -> None:
        if a.result == "ok":
            endpoint.failing_since = None
            endpoint.last_success_at = now
            return
        if endpoint.failing_since is None:
            endpoint.failing_since = now
        if not endpoint.active:
            return
        reason = None
        if a.status == 410:
            reason = f"disabled on {now:%Y-%m-%d %H:%M} UTC: the endpoint answered 410 Gone"
        elif now - endpoint.failing_since >= AUTO_DISABLE_AFTER:
            reason = (
                f"disabled on {now:%Y-%m-%d %H:%M} UTC: every delivery failed since "
                f"{endpoint.failing_since:%Y-%m-%d %H:%M} UTC (last: {a.error or a.result})"
            )
        if reason is not None:
            endpoint.active = False
            endpoint.disabled_reason = reason
            endpoint.disabled_at = now
            audit.record(session, SYSTEM, "webhook.disable", f"hook:{endpoint.id}", reason=reason, url=endpoint.url)
            log.warning("webhook endpoint disabled", hook=endpoint.id, reason=reason)

    # -- order and housekeeping ---------------------------------------------------------------------

    @staticmethod
    def _blocked(older: Any) -> Any:
        """An older row of the same endpoint and order key is still pending."""
        return _blocked(older)

    async def housekeeping(self) -> None:
        """Outbox depth and age gauges; prune finished rows and old log entries."""
        now = self.cfg.clock()
        async with self.db.session() as session:
            depth, oldest = (
                await session.execute(
                    select(func.count(WebhookOutbox.id), func.min(WebhookOutbox.created_at)).where(
                        WebhookOutbox.state == "pending"
                    )
                )
            ).one()
        metrics.OUTBOX_DEPTH.set(depth or 0)
        metrics.OUTBOX_OLDEST.set((now - oldest).total_seconds() if oldest else 0)
        async with self.db.session(write=True) as session:
            await session.execute(
                delete(WebhookOutbox).where(
                    and_(
                        WebhookOutbox.state.in_(("delivered", "failed")),
                        WebhookOutbox.finished_at < now - KEEP_FINISHED,
                    )
                )
            )
            await session.execute(delete(WebhookDelivery).where(WebhookDelivery.started_at < now - KEEP_LOG))


def __getattr__(name: str) -> Any:
    # `Deliverer` lived here before `webhooks.deliverer` existed: `from webhooks.outbox import
    # Deliverer` keeps working (lazily: the deliverer module imports this one).
    if name == "Deliverer":
        from webhooks.deliverer import Deliverer

        return Deliverer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
