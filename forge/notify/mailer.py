"""The mailer: the loop that sends the e-mail outbox (`mail_outbox`) over SMTP.

Claiming: a row is leased (`lease_until`, `claim_token`) in a short transaction before it is sent
(PostgreSQL: `SELECT ... FOR UPDATE SKIP LOCKED`, so two processes never lease one row; SQLite has
one writer at a time), and marked sent only by the holder of its lease. A process that dies
mid-send leaves a lease that runs out; the row is sent again then (at least once: a crash between
the server's acceptance and the mark is the one way to a duplicate).

Sending: `smtplib` in a worker thread, one connection per batch, every step under
`smtp_timeout_seconds`. A temporary failure (no connection, a timeout, a 4xx answer) is retried
with exponential backoff, capped, up to `MAX_ATTEMPTS`; a permanent one (a 5xx answer: the address
refused) fails the row at once. The backoff is written here rather than with `stamina`: the wait
is a database timestamp (`next_attempt_at`) that survives a restart, not a sleep in a call."""

import asyncio
import contextlib
import smtplib
import ssl
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

import structlog
from sqlalchemy import or_, select, update

from forge.core.settings import Settings
from forge.db.engine import Database, utcnow
from forge.db.notify_models import MailOutbox
from forge.notify.mail import message

log = structlog.get_logger("forgehand.notify")

LEASE = timedelta(minutes=5)
BATCH = 20
MAX_ATTEMPTS = 12  # about a day of retries with the backoff below
FIRST_RETRY = timedelta(seconds=30)
LONGEST_RETRY = timedelta(hours=4)
POLL_SECONDS = 30.0  # a wake-up after each commit that wrote rows makes this a fallback


@dataclass(frozen=True)
class Sent:
    row_id: int
    error: str = ""  # "" when the server took it
    permanent: bool = False


def backoff(attempts: int) -> timedelta:
    """The wait before attempt `attempts + 1`: 30 s, 1 min, 2 min ... up to 4 h."""
    wait: timedelta = FIRST_RETRY * (2 ** max(0, attempts - 1))
    return min(wait, LONGEST_RETRY)


class Mailer:
    """Sends due outbox rows; `start()` runs the loop until `stop()`, `run_once()` one round."""

    def __init__(self, db: Database, settings: Settings, *, poll_seconds: float = POLL_SECONDS) -> None:
        self.db = db
        self.settings = settings
        self.poll_seconds = poll_seconds
        self.worker_id = uuid.uuid4().hex[:16]
        self._task: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def enabled(self) -> bool:
        return bool(self.settings.smtp_host)

    # -- claiming and recording ----------------------------------------------------------------

    async def claim(self, now: datetime | None = None, limit: int = BATCH) -> list[MailOutbox]:
        """Lease up to `limit` due rows for this mailer."""
        now = now or utcnow()
        o = MailOutbox
        async with self.db.session(write=True) as session:
            stmt = (
                select(o)
                .where(
                    o.state == "pending", o.next_attempt_at <= now, or_(o.lease_until.is_(None), o.lease_until < now)
                )
                .order_by(o.next_attempt_at, o.id)
                .limit(limit)
            )
            if session.bind.dialect.name == "postgresql":
                stmt = stmt.with_for_update(skip_locked=True)
            rows = list((await session.execute(stmt)).scalars())
            for row in rows:
                row.lease_until = now + LEASE
                row.claim_token = self.worker_id
            await session.flush()
            session.expunge_all()
        return rows

    async def record(self, results: list[Sent], now: datetime | None = None) -> None:
        """Mark each row sent, failed, or due again later (only rows this mailer holds)."""
        now = now or utcnow()
        o = MailOutbox
        async with self.db.session(write=True) as session:
            for result in results:
                mine = update(o).where(o.id == result.row_id, o.claim_token == self.worker_id, o.state == "pending")
                if not result.error:
                    await session.execute(mine.values(state="sent", sent_at=now, lease_until=None, claim_token=None))
                    continue
                row = await session.get(o, result.row_id)
                attempts = (row.attempts if row is not None else 0) + 1
                failed = result.permanent or attempts >= MAX_ATTEMPTS
                await session.execute(
                    mine.values(
                        state="failed" if failed else "pending", attempts=attempts, last_error=result.error[:500],
                        next_attempt_at=now + backoff(attempts), lease_until=None, claim_token=None,
                    )
                )  # fmt: skip
                log.warning("e-mail not sent", outbox_id=result.row_id, attempts=attempts, error=result.error[:200])

    # -- sending -------------------------------------------------------------------------------

    def _connect(self) -> smtplib.SMTP:
        s = self.settings
        timeout = s.smtp_timeout_seconds
        smtp: smtplib.SMTP
        if s.smtp_port == 465:
            smtp = smtplib.SMTP_SSL(s.smtp_host, s.smtp_port, timeout=timeout, context=ssl.create_default_context())
        else:
            smtp = smtplib.SMTP(s.smtp_host, s.smtp_port, timeout=timeout)
            if s.smtp_starttls:
                smtp.starttls(context=ssl.create_default_context())
        if s.smtp_user:
            smtp.login(s.smtp_user, s.smtp_password)
        return smtp

    def send_batch(self, rows: list[MailOutbox]) -> list[Sent]:
        """Blocking (a worker thread): one connection, each row sent or its error."""
        try:
            smtp = self._connect()
        except (OSError, smtplib.SMTPException) as exc:
            permanent = isinstance(exc, smtplib.SMTPAuthenticationError)
            return [Sent(r.id, f"cannot connect to {self.settings.smtp_host}: {exc}", permanent) for r in rows]
        results: list[Sent] = []
        try:
            for row in rows:
                results.append(self._send_one(smtp, row))
        finally:
            with contextlib.suppress(OSError, smtplib.SMTPException):
                smtp.quit()
        return results

    def _send_one(self, smtp: smtplib.SMTP, row: MailOutbox) -> Sent:
        try:
            smtp.send_message(message(self.settings, row), from_addr=self.settings.smtp_from, to_addrs=[row.to_addr])
        except smtplib.SMTPRecipientsRefused as exc:
            codes = [code for code, _msg in exc.recipients.values()]
            return Sent(row.id, f"recipient refused: {exc.recipients}", permanent=all(c >= 500 for c in codes))
        except smtplib.SMTPResponseException as exc:
            return Sent(row.id, f"{exc.smtp_code} {exc.smtp_error!r}", permanent=exc.smtp_code >= 500)
        except (OSError, smtplib.SMTPException) as exc:
            return Sent(row.id, str(exc) or type(exc).__name__)
        return Sent(row.id)

    async def run_once(self, now: datetime | None = None) -> int:
        """Claim what is due, send it, record it; returns how many rows were tried."""
        rows = await self.claim(now)
        if not rows:
            return 0
        results = await asyncio.to_thread(self.send_batch, rows)
        await self.record(results)
        return len(rows)

    # -- the loop ------------------------------------------------------------------------------

    def wake(self) -> None:
        """Send now (thread-safe; after a commit that wrote outbox rows)."""
        loop, event = self._loop, self._wake
        if loop is not None and event is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(event.set)

    async def start(self) -> None:
        if not self.enabled or self._task is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._task = asyncio.create_task(self._run(), name="forgehand-mailer")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        assert self._wake is not None
        while True:
            self._wake.clear()
            try:
                tried = await self.run_once()
            except Exception:
                log.exception("the mailer's round failed")
                tried = 0
            if tried:
                continue  # there may be more
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.poll_seconds)
