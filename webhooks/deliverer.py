"""The notification deliverer: the loop that leases due outbox rows, signs and posts them and
records every attempt (a pipeline: database work overlaps the sends). It holds an `OutboxStore`
(`webhooks.outbox_store`: claiming and recording rows, endpoint health); the retry schedule is
`webhooks.schedule`, the delivery guarantees are described in `webhooks.outbox`.
"""

import asyncio
import contextlib
import random
import time
import uuid
from datetime import timedelta

import structlog

from forge.db.engine import Database
from webhooks import schedule
from webhooks.config import WebhooksConfig
from webhooks.outbound import Outbound, OutboundError
from webhooks.outbox_store import Attempt, Claimed, OutboxStore
from webhooks.protocol import NOTIFY_EVENTS
from webhooks.schedule import LEASE, LEASE_MARGIN, parse_retry_after
from webhooks.signing import redacted, request_headers, sign_jwt

log = structlog.get_logger("forgehand.webhooks")
LOG_RESPONSE_BYTES = 64 * 1024  # of a response body, kept in the delivery log


class Deliverer:
    """Claims due outbox rows through its `store` and delivers them; `run()` loops until `stop()`."""

    def __init__(
        self,
        db: Database,
        cfg: WebhooksConfig,
        outbound: Outbound,
        *,
        rng: random.Random | None = None,
        lease: timedelta = LEASE,
        poll_interval: float = 1.0,
        batch: int | None = None,
        window: int | None = None,
        store: OutboxStore | None = None,
    ) -> None:
        self.cfg = cfg
        self.store = store or OutboxStore(db, cfg, rng=rng, lease=lease, batch=batch)
        if self.store.wake is None:
            self.store.wake = self.wake  # a recovery made rows due: claim them now, not at the next poll
        self.outbound = outbound
        self.poll_interval = poll_interval
        # Rows leased at a time by the loop (`run`): enough for the database work to overlap the
        # sends; a row that would start too late to finish within its lease is not sent (see `run`).
        self.window = window or max(1, cfg.delivery_concurrency * 4)
        self.worker_id = uuid.uuid4().hex[:12]
        self._wake: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._last_housekeeping = 0.0
        self._poke = False

    # -- one attempt ---------------------------------------------------------------------------

    async def attempt(self, c: Claimed) -> Attempt:
        started_at = self.cfg.clock()
        now = int(time.time())
        token, jti = sign_jwt(
            c.keys[0],
            issuer=self.cfg.instance_id,
            subject=c.subject,
            audience=c.url,
            wid=c.wid,
            event_type=c.event_type,
            body=c.body,
            budget=schedule.TOTAL_TIMEOUT,
            now=now,
        )
        headers = request_headers(
            token=token,
            event_type=c.event_type,
            wid=c.wid,
            notification_keys=c.keys if c.event_type in NOTIFY_EVENTS else None,
            timestamp=now,
            body=c.body,
        )
        t0 = time.monotonic()
        status: int | None = None
        error = ""
        response_headers: list[tuple[str, str]] = []
        response_body = b""
        truncated = False
        retry_after: float | None = None
        try:
            reply = await self.outbound.post(
                c.url,
                headers,
                c.body,
                total_timeout=schedule.TOTAL_TIMEOUT,
                connect_timeout=schedule.CONNECT_TIMEOUT,
                max_response=LOG_RESPONSE_BYTES,
            )
        except OutboundError as exc:
            result = "timeout" if exc.kind == "timeout" else "connection_error"
            error = exc.detail
        else:
            status = reply.status
            response_headers = reply.headers
            response_body = reply.body
            truncated = reply.truncated
            if 200 <= reply.status < 300:
                result = "ok"
            else:
                result = "http_error"
                error = f"HTTP {reply.status}" + (" (redirects are not followed)" if 300 <= reply.status < 400 else "")
                ra = next((v for k, v in reply.headers if k.lower() == "retry-after"), None)
                retry_after = parse_retry_after(ra, self.cfg.clock())
        return Attempt(
            result=result,
            status=status,
            error=error[:500],
            headers=headers,
            jti=jti,
            request_headers=redacted(headers),
            response_headers=response_headers,
            response_body=response_body,
            truncated=truncated,
            started_at=started_at,
            duration_ms=int((time.monotonic() - t0) * 1000),
            retry_after=retry_after,
        )

    # -- loop ---------------------------------------------------------------------------------------

    async def run_once(self) -> int:
        """Claim what is due, deliver it concurrently, record each attempt; returns how many."""
        claimed = await self.store.claim()
        if not claimed:
            return 0
        limit = asyncio.Semaphore(max(1, self.cfg.delivery_concurrency))

        async def one(c: Claimed) -> tuple[Claimed, Attempt]:
            async with limit:
                return c, await self.attempt(c)

        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(one(c)) for c in claimed]
        await self.store.record_many([t.result() for t in tasks])
        return len(claimed)

    # -- the store, as the deliverer uses it -------------------------------------------------------

    async def claim(self, limit: int | None = None) -> list[Claimed]:
        """Lease due rows for this deliverer (`OutboxStore.claim`)."""
        return await self.store.claim(limit)

    async def record(self, c: Claimed, a: Attempt) -> None:
        await self.store.record_many([(c, a)])

    async def next_due_in(self) -> float | None:
        """Seconds until a row can be claimed (`OutboxStore.next_due_in`)."""
        return await self.store.next_due_in()

    def wake(self) -> None:
        """Deliver now (thread-safe; called after a transaction that wrote outbox rows commits)."""
        loop = self._loop
        if loop is None or self._wake is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(self._poked)

    def _poked(self) -> None:
        self._poke = True
        if self._wake is not None:
            self._wake.set()

    async def run(self) -> None:
        """The delivery loop, a pipeline: up to `window` rows are leased at a time; sends run
        concurrently (at most `delivery_concurrency`) while the loop records finished attempts
        (all that finished since the last commit, in one transaction) and claims more rows as
        soon as half the window is free. Database work thus overlaps the network instead of
        alternating with it. A row of a task is claimable only after the previous row of that
        task (and endpoint) is recorded, so order per endpoint and task holds."""
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        slots = asyncio.Semaphore(max(1, self.cfg.delivery_concurrency))
        window = max(1, self.window)
        threshold = max(1, window // 2)
        inflight: set[asyncio.Task[None]] = set()
        finished: list[tuple[Claimed, Attempt]] = []
        claim_more = True  # the last claim found rows, or something changed since

        async def send(c: Claimed) -> None:
            try:
                async with slots:
                    if c.lease_until is not None and self.cfg.clock() + LEASE_MARGIN > c.lease_until:
                        # It waited for a slot too long (slow endpoints): sending now could overlap
                        # with another deliverer's claim. Left leased, it goes again after the lease.
                        return
                    attempt = await self.attempt(c)
            except Exception:
                # Not recorded: the row stays leased and goes again after the lease.
                log.exception("webhook delivery attempt failed", outbox=c.outbox_id)
                return
            finished.append((c, attempt))
            if self._wake is not None:
                self._wake.set()

        try:
            while True:
                self._wake.clear()
                try:
                    if self._poke:
                        self._poke, claim_more = False, True
                    if self._stopping:
                        if finished:
                            batch, finished[:] = list(finished), []
                            await self.store.record_many(batch)
                        if not inflight:
                            return
                        await self._wake.wait()
                        continue
                    if time.monotonic() - self._last_housekeeping > 60:
                        self._last_housekeeping = time.monotonic()
                        await self.store.housekeeping()
                    sending = sum(1 for t in inflight if not t.done())
                    if finished and sending and len(finished) < threshold and window - sending < threshold:
                        # No room to claim yet: what finished is recorded with the next claim (one
                        # commit for many attempts; a crash before it means a redelivery, as
                        # always). A send still running wakes the loop when it ends.
                        await self._wake.wait()
                        continue
                    batch, finished[:] = list(finished), []
                    if batch:
                        claim_more = True  # a recorded row may unblock the next one of its task
                    room = window - len(inflight)
                    limit = room if claim_more and room >= threshold else 0
                    if batch or limit:
                        # Record what finished and claim more in one transaction (one commit).
                        claimed = await self.store.record_and_claim(batch, limit)
                        if limit:
                            # Fewer than asked: nothing else is claimable now (a recorded row, new
                            # rows or a poke set this again), so no empty claim follows.
                            claim_more = len(claimed) >= limit
                        for c in claimed:
                            task = asyncio.create_task(send(c))
                            inflight.add(task)
                            task.add_done_callback(inflight.discard)
                        if claimed or batch:
                            continue
                    if inflight or finished:
                        if not finished:
                            await self._wake.wait()  # a send finished, or new rows were committed
                        continue
                    # Idle, and the last claim found nothing.
                    due = await self.store.next_due_in()
                    if due == 0:
                        due = 0.2  # due, yet not claimable: another deliverer was quicker
                except Exception:
                    log.exception("webhook deliverer iteration failed")
                    due = self.poll_interval
                    claim_more = True
                    if inflight:
                        with contextlib.suppress(TimeoutError):
                            async with asyncio.timeout(due):
                                await self._wake.wait()
                        continue
                wait = self.poll_interval if due is None else min(max(due, 0.05), self.poll_interval)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait):
                        await self._wake.wait()
                claim_more = True
        finally:
            for task in list(inflight):
                task.cancel()

    async def start(self) -> None:
        if self._task is None:
            self._stopping = False
            self._task = asyncio.create_task(self.run(), name="webhooks-deliverer")
            await asyncio.sleep(0)

    async def stop(self, grace: float = 5.0) -> None:
        """Stop after the batch in flight is recorded (up to `grace` seconds), then cancel."""
        self._stopping = True
        task, self._task = self._task, None
        if task is None:
            return
        if self._wake is not None:
            self._wake.set()
        try:
            async with asyncio.timeout(grace):
                await asyncio.shield(task)
        except TimeoutError:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
