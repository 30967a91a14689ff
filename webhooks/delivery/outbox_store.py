"""The outbox rows' store: claims due rows with a lease and records every attempt (delivery log,
row state and retry time, endpoint health, which may disable an endpoint), a few statements per
batch whatever its size. The deliverer (`webhooks.delivery.deliverer`) holds one; the guarantees are
described in `webhooks.delivery.outbox`, the schedule in `webhooks.delivery.schedule`."""

import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import (
    and_,
    case,
    delete,
    func,
    select,
    type_coerce,
)
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from forge.db.engine import Database, UTCDateTime
from webhooks.core import metrics
from webhooks.core.config import WebhooksConfig, unseal
from webhooks.core.models import WebhookDelivery, WebhookEndpoint, WebhookOutbox
from webhooks.core.signing import SigningKey
from webhooks.delivery import endpoint_health, recovery
from webhooks.delivery.outbox import wake_after_commit
from webhooks.delivery.outbox_sql import (
    CLAIM,
    ENDPOINTS,
    FINISHED_UPDATE,
    LEASE_UPDATE,
    LOG_INSERT,
    OUTBOX,
    OWNED_UPDATE,
    STATE,
    SUCCESS_UPDATE,
    blocked,
)
from webhooks.delivery.schedule import KEEP_FINISHED, KEEP_LOG, LEASE, retry_delay
from webhooks.sdk.protocol import NOTIFY_EVENTS


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


HEALTH_STAMP_EVERY = timedelta(seconds=1)
_NEVER = datetime.min.replace(tzinfo=UTC)


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
    loop (`webhooks.delivery.deliverer.Deliverer`) holds one."""

    def __init__(
        self,
        db: Database,
        cfg: WebhooksConfig,
        *,
        rng: random.Random | None = None,
        lease: timedelta = LEASE,
        batch: int | None = None,
        wake: Callable[[], None] | None = None,
    ) -> None:
        self.db = db
        self.wake = wake  # called after a commit that made rows due at once (a recovery)
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
        rows = (await conn.execute(CLAIM[self._pg], {"_now": now, "_limit": max(1, limit)})).all()
        if not rows:
            return []
        await conn.execute(LEASE_UPDATE, {"_ids": [r[0] for r in rows], "_until": now + self.lease, "_token": token})
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
        rows, failing = await self._read_state(conn, done)
        if len(rows) < len({c.outbox_id for c, _ in done}):
            done = await self._of_live_endpoints(session, done)
            if not done:
                return
        owned, finished_elsewhere = self._row_updates(done, rows, now)
        logged = [_log_values(c, a, c.outbox_id if c.outbox_id in rows else None) for c, a in done]
        await conn.execute(LOG_INSERT, logged)
        if owned:
            await conn.execute(OWNED_UPDATE, owned)
        if finished_elsewhere:
            await conn.execute(FINISHED_UPDATE, finished_elsewhere)
        # Endpoint health: failures first (they may disable an endpoint and write audit rows),
        # then any success of this batch clears `failing_since`.
        failed_ids = await self._note_failures(session, done, now)
        await self._note_successes(session, conn, done, failing, failed_ids, now)

    async def _read_state(
        self, conn: AsyncConnection, done: list[tuple[Claimed, Attempt]]
    ) -> tuple[dict[int, tuple[str, str | None]], set[int]]:
        """The state and claim token of each row still there, and the endpoints whose
        `failing_since` is set (read under the write lock)."""
        found_rows = await conn.execute(STATE[self._pg], {"_ids": [c.outbox_id for c, _ in done]})
        rows: dict[int, tuple[str, str | None]] = {}
        failing: set[int] = set()
        for oid, state, token, endpoint_id, failing_since in found_rows.all():
            rows[oid] = (state, token)
            if failing_since is not None:
                failing.add(endpoint_id)
        return rows, failing

    @staticmethod
    async def _of_live_endpoints(
        session: AsyncSession, done: list[tuple[Claimed, Attempt]]
    ) -> list[tuple[Claimed, Attempt]]:
        """Rows go with their endpoint: an endpoint deleted while the attempt was in flight took
        its log with it (an attempt of a row that is gone otherwise is still logged)."""
        endpoint_ids = {c.endpoint_id for c, _ in done}
        found = await session.execute(select(ENDPOINTS.c.id).where(ENDPOINTS.c.id.in_(endpoint_ids)))
        alive = set(found.scalars())
        return [(c, a) for c, a in done if c.endpoint_id in alive]

    def _row_updates(
        self, done: list[tuple[Claimed, Attempt]], rows: dict[int, tuple[str, str | None]], now: datetime
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The updates of the rows still claimed by this store (delivered, failed, or when to try
        again), and of the rows delivered after another deliverer re-claimed them."""
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
            owned.append(self._owned_values(c, a, now))
        return owned, finished_elsewhere

    def _owned_values(self, c: Claimed, a: Attempt, now: datetime) -> dict[str, Any]:
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
        return values

    @staticmethod
    async def _note_failures(session: AsyncSession, done: list[tuple[Claimed, Attempt]], now: datetime) -> set[int]:
        """Each failure counts against its endpoint's health; returns the endpoints that failed."""
        failed = [(c, a) for c, a in done if a.result != "ok"]
        for c, a in failed:
            endpoint = await session.get(WebhookEndpoint, c.endpoint_id)
            if endpoint is not None:
                endpoint_health.note_failure(session, endpoint, status=a.status, error=a.error or a.result, now=now)
        if failed:
            await session.flush()
        return {c.endpoint_id for c, _ in failed}

    async def _note_successes(
        self,
        session: AsyncSession,
        conn: AsyncConnection,
        done: list[tuple[Claimed, Attempt]],
        failing: set[int],
        failed_ids: set[int],
        now: datetime,
    ) -> None:
        """A success clears `failing_since` and stamps `last_success_at`; skipped for an endpoint
        that is not failing and whose stamp this store wrote less than `HEALTH_STAMP_EVERY` ago
        (by the deliverer's clock): `last_success_at` then lags by at most that much."""
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
            await conn.execute(SUCCESS_UPDATE, {"_ids": list(succeeded), "_now": now})
            # Failing before (or in) this batch and answering now: its waiting rows go at once.
            moved = await recovery.catch_up(conn, succeeded & (failing | failed_ids), now)
            if moved:
                metrics.CAUGHT_UP.inc(moved)
                if self.wake is not None:
                    wake_after_commit(session, self.wake)
            for endpoint_id in succeeded:
                self._stamped[endpoint_id] = now
        for endpoint_id in failed_ids - succeeded:
            self._stamped.pop(endpoint_id, None)

    async def next_due_in(self) -> float | None:
        """Seconds until a row can be claimed (0: now), None when no row ever can as things stand.
        Rows of inactive endpoints, rows waiting behind an older one, and leased rows (until their
        lease ends) do not count, so an idle deliverer only reads."""
        o = OUTBOX.c
        ready_at = case((o.lease_until > o.next_attempt_at, o.lease_until), else_=o.next_attempt_at)
        stmt = (
            select(func.min(type_coerce(ready_at, UTCDateTime())))
            .select_from(OUTBOX.join(ENDPOINTS, ENDPOINTS.c.id == o.endpoint_id))
            .where(o.state == "pending", ENDPOINTS.c.active.is_(True), ~blocked(o, OUTBOX.alias("older").c))
        )
        async with self.db.session() as session:
            when: datetime | None = (await session.execute(stmt)).scalar_one_or_none()
        if when is None:
            return None
        return max(0.0, (when - self.cfg.clock()).total_seconds())

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
