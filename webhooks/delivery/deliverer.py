"""The notification deliverer: the loop that leases due outbox rows, signs and posts them and
records every attempt (a pipeline: database work overlaps the sends). It holds an `OutboxStore`
(`webhooks.delivery.outbox_store`: claiming and recording rows, endpoint health); the retry schedule is
`webhooks.delivery.schedule`, the delivery guarantees are described in `webhooks.delivery.outbox`.
"""

import asyncio
import contextlib
import random
import time
import uuid
from datetime import timedelta

import structlog

from forge.db.engine import Database
from webhooks.core.config import WebhooksConfig
from webhooks.core.outbound import Outbound, OutboundError, Reply
from webhooks.core.signing import redacted, request_headers, sign_jwt
from webhooks.delivery import schedule
from webhooks.delivery.outbox_store import Attempt, Claimed, OutboxStore
from webhooks.delivery.schedule import LEASE, LEASE_MARGIN, parse_retry_after
from webhooks.sdk.protocol import NOTIFY_EVENTS

log = structlog.get_logger("forgehand.webhooks")
LOG_RESPONSE_BYTES = 64 * 1024  # of a response body, kept in the delivery log


class _Window:
    """The loop's state: the rows being sent (at most `size` leased at a time, sends limited by
    `slots`) and the attempts finished but not yet recorded."""

    def __init__(self, wake: asyncio.Event, size: int, concurrency: int) -> None:
        self.wake = wake
        self.size = max(1, size)
        self.threshold = max(1, self.size // 2)
        self.slots = asyncio.Semaphore(max(1, concurrency))
        self.inflight: set[asyncio.Task[None]] = set()
        self.finished: list[tuple[Claimed, Attempt]] = []
        self.claim_more = True  # the last claim found rows, or something changed since

    def take_finished(self) -> list[tuple[Claimed, Attempt]]:
        batch, self.finished[:] = list(self.finished), []
        return batch

    def no_room_yet(self) -> bool:
        """Attempts wait to be recorded, but too few to be worth a commit, and too many rows are
        being sent to claim more: better wait for a send."""
        sending = sum(1 for t in self.inflight if not t.done())
        return bool(
            self.finished and sending and len(self.finished) < self.threshold and self.size - sending < self.threshold
        )


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
        """Sign and post one claimed row (no retry here: the store schedules the next attempt)."""
        started_at = self.cfg.clock()
        headers, jti = self._signed_headers(c)
        t0 = time.monotonic()
        sent = await self._post(c, headers)
        result, error, retry_after = self._judge(sent)
        reply = sent if isinstance(sent, Reply) else None
        return Attempt(
            result=result,
            status=reply.status if reply is not None else None,
            error=error[:500],
            headers=headers,
            jti=jti,
            request_headers=redacted(headers),
            response_headers=reply.headers if reply is not None else [],
            response_body=reply.body if reply is not None else b"",
            truncated=reply.truncated if reply is not None else False,
            started_at=started_at,
            duration_ms=int((time.monotonic() - t0) * 1000),
            retry_after=retry_after,
        )

    def _signed_headers(self, c: Claimed) -> tuple[list[tuple[str, str]], str]:
        """The request's headers (a JWT with a fresh `jti`; for a notification also the Standard
        Webhooks signature with every stored secret) and that `jti`."""
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
        return headers, jti

    async def _post(self, c: Claimed, headers: list[tuple[str, str]]) -> Reply | OutboundError:
        try:
            return await self.outbound.post(
                c.url,
                headers,
                c.body,
                total_timeout=schedule.TOTAL_TIMEOUT,
                connect_timeout=schedule.CONNECT_TIMEOUT,
                max_response=LOG_RESPONSE_BYTES,
            )
        except OutboundError as exc:
            return exc

    def _judge(self, sent: Reply | OutboundError) -> tuple[str, str, float | None]:
        """The attempt's result class, its error text and the delay the endpoint asked for."""
        if isinstance(sent, OutboundError):
            return ("timeout" if sent.kind == "timeout" else "connection_error"), sent.detail, None
        if 200 <= sent.status < 300:
            return "ok", "", None
        error = f"HTTP {sent.status}" + (" (redirects are not followed)" if 300 <= sent.status < 400 else "")
        retry_after = next((v for k, v in sent.headers if k.lower() == "retry-after"), None)
        return "http_error", error, parse_retry_after(retry_after, self.cfg.clock())

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
        win = _Window(self._wake, self.window, self.cfg.delivery_concurrency)
        try:
            while True:
                win.wake.clear()
                try:
                    if self._poke:
                        self._poke, win.claim_more = False, True
                    if self._stopping:
                        if await self._wind_down(win):
                            return
                        continue
                    if await self._turn(win):
                        continue
                    due = await self._idle_due()
                except Exception:
                    log.exception("webhook deliverer iteration failed")
                    due, win.claim_more = self.poll_interval, True
                    if win.inflight:
                        await self._sleep(win, due)
                        continue
                await self._sleep(win, self.poll_interval if due is None else min(max(due, 0.05), self.poll_interval))
                win.claim_more = True
        finally:
            for task in list(win.inflight):
                task.cancel()

    async def _wind_down(self, win: _Window) -> bool:
        """Stopping: record what finished, wait for the sends in flight; True once none is left."""
        if win.finished:
            await self.store.record_many(win.take_finished())
        if not win.inflight:
            return True
        await win.wake.wait()
        return False

    async def _turn(self, win: _Window) -> bool:
        """One turn of the pipeline: record what finished and claim more in one transaction, or
        wait for a send. False when there is nothing to do (idle, and the last claim found nothing)."""
        if time.monotonic() - self._last_housekeeping > 60:
            self._last_housekeeping = time.monotonic()
            await self.store.housekeeping()
        if win.no_room_yet():
            # No room to claim yet: what finished is recorded with the next claim (one commit
            # for many attempts; a crash before it means a redelivery, as always). A send still
            # running wakes the loop when it ends.
            await win.wake.wait()
            return True
        if await self._record_and_claim(win):
            return True
        if win.inflight or win.finished:
            if not win.finished:
                await win.wake.wait()  # a send finished, or new rows were committed
            return True
        return False

    async def _record_and_claim(self, win: _Window) -> bool:
        """Record what finished and claim more in one transaction (one commit), and start sending
        what was claimed; True when something was recorded or claimed."""
        batch = win.take_finished()
        if batch:
            win.claim_more = True  # a recorded row may unblock the next one of its task
        room = win.size - len(win.inflight)
        limit = room if win.claim_more and room >= win.threshold else 0
        if not batch and not limit:
            return False
        claimed = await self.store.record_and_claim(batch, limit)
        if limit:
            # Fewer than asked: nothing else is claimable now (a recorded row, new rows or a
            # poke set this again), so no empty claim follows.
            win.claim_more = len(claimed) >= limit
        for c in claimed:
            task = asyncio.create_task(self._send(win, c))
            win.inflight.add(task)
            task.add_done_callback(win.inflight.discard)
        return bool(claimed or batch)

    async def _send(self, win: _Window, c: Claimed) -> None:
        try:
            async with win.slots:
                if c.lease_until is not None and self.cfg.clock() + LEASE_MARGIN > c.lease_until:
                    # It waited for a slot too long (slow endpoints): sending now could overlap
                    # with another deliverer's claim. Left leased, it goes again after the lease.
                    return
                attempt = await self.attempt(c)
        except Exception:
            # Not recorded: the row stays leased and goes again after the lease.
            log.exception("webhook delivery attempt failed", outbox=c.outbox_id)
            return
        win.finished.append((c, attempt))
        win.wake.set()

    async def _idle_due(self) -> float | None:
        """Idle: seconds until a row can be claimed (None: no row can be as things stand)."""
        due = await self.store.next_due_in()
        return 0.2 if due == 0 else due  # due, yet not claimable: another deliverer was quicker

    @staticmethod
    async def _sleep(win: _Window, seconds: float) -> None:
        """Wait until woken (a send finished, rows were committed, a poke) or `seconds` passed."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await win.wake.wait()

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
