"""The background writer of policy delivery-log rows: off the dispatch's critical path.

A dispatch hands its rows over and returns its decision at once; the writer commits whatever has
accumulated in one transaction (a group commit: under load, rows pile up while the previous batch
is written, so batches grow by themselves and no timer delays a quiet system). The writer task
exists only while there is something to write, so an idle process holds no task.

Durability: rows live in memory until their batch commits, normally a few milliseconds. A crash
(SIGKILL, power loss) in that window loses those log rows, never a decision (the decision was
already obeyed by the caller). A failing database is retried a few times with back-off; then the
batch is dropped with an error in the log. At most `MAX_PENDING` rows wait; beyond that the
oldest are dropped (and counted in the log), so a dead database cannot grow memory without bound.
`flush()` waits until everything handed over so far is written (or dropped); `aclose()` flushes.
"""

import asyncio
import contextlib
from typing import Any

import structlog
from sqlalchemy import insert, select

from forge.db.engine import Database
from webhooks.core.models import DELIVERIES, WebhookEndpoint

log = structlog.get_logger("forgehand.webhooks")

MAX_BATCH = 500
LINGER = 0.1  # seconds a batch collects rows before it is written
MAX_PENDING = 10_000
RETRIES = (0.05, 0.2, 1.0)

# One delivery-log row as column values (`WebhookDelivery` columns; all rows alike).
LogRow = dict[str, Any]


class DeliveryLogWriter:
    def __init__(self, db: Database) -> None:
        self.db = db
        self._pending: list[LogRow] = []
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.dropped = 0

    def submit(self, rows: list[LogRow]) -> None:
        """Queue rows for the next batch (must be called on the event loop that runs dispatches)."""
        if not rows:
            return
        self._pending.extend(rows)
        if len(self._pending) > MAX_PENDING:
            over = len(self._pending) - MAX_PENDING
            del self._pending[:over]
            self.dropped += over
            log.error("policy delivery log backlog full: oldest rows dropped", dropped=over)
        loop = asyncio.get_running_loop()
        if self._task is None or self._task.done() or self._loop is not loop:
            self._loop = loop
            self._task = loop.create_task(self._run(), name="webhooks-policy-log")

    async def _run(self) -> None:
        while self._pending:
            # Let the rows of the dispatches that follow join this batch: one commit for many.
            await asyncio.sleep(LINGER)
            batch, self._pending = self._pending[:MAX_BATCH], self._pending[MAX_BATCH:]
            await self._write(batch)

    async def _write(self, batch: list[LogRow]) -> None:
        for delay in (*RETRIES, None):
            try:
                async with self.db.session(write=True) as session:
                    await session.execute(insert(DELIVERIES), batch)
                return
            except asyncio.CancelledError:
                raise
            except Exception:
                if delay is None:
                    self.dropped += len(batch)
                    log.exception("could not record policy deliveries", count=len(batch))
                    return
                await asyncio.sleep(delay)
                # Without the rows of an endpoint deleted meanwhile (its log went with it; the key fails).
                batch = await self._still_wanted(batch)
                if not batch:
                    return

    async def _still_wanted(self, batch: list[LogRow]) -> list[LogRow]:
        ids = {r["endpoint_id"] for r in batch}
        try:
            async with self.db.session() as session:
                stmt = select(WebhookEndpoint.id).where(WebhookEndpoint.id.in_(ids))
                found = set((await session.execute(stmt)).scalars())
        except Exception:
            return batch
        return [r for r in batch if r["endpoint_id"] in found]

    async def flush(self) -> None:
        """Wait until every row submitted so far is written (or given up)."""
        task = self._task
        if task is None or self._loop is not asyncio.get_running_loop():
            return
        while not task.done():
            await asyncio.wait({task})
            task = self._task
            if task is None:
                return

    async def aclose(self) -> None:
        with contextlib.suppress(Exception):
            await self.flush()
