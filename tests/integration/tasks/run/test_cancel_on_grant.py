"""A cancel that arrives just as a wait is granted is never lost. Python 3.11's `asyncio.wait_for`
returned the result and dropped such a cancel: a run's transcript writer, cancelled by `close()`
as its database write turn came up, went back to waiting for work and `close()` never returned (a
run that never ended; found by the ingest benches). Waits are `asyncio.timeout` blocks now."""

import asyncio

from sqlalchemy import func, select

from forge.core.settings import Settings
from forge.db.engine import Database
from tasks.core.live import LiveHub
from tasks.core.models import TranscriptEvent
from tasks.core.redaction import Redactor
from tasks.core.transcript import Notice
from tasks.core.writer import TranscriptWriter
from tests.support.tasks import seed, start_task
from tests.support.waiting import until

OFFSETS = range(12)  # loop turns between "the holder let go" and the cancel


async def hold(db: Database, entered: asyncio.Event, release: asyncio.Event) -> None:
    """Hold the database's write turn until `release`."""
    async with db.session(write=True):
        entered.set()
        await release.wait()


def turn_waiters(db: Database) -> int:
    """How many of this loop's writers wait for SQLite's write turn (none without a turn lock:
    PostgreSQL's writers do not queue in-process)."""
    lock = db._turns.get(asyncio.get_running_loop()) if db._turns is not None else None
    return len(lock._waiters or ()) if lock is not None else 0


async def write(db: Database, went_on: list[int], turns: int) -> None:
    async with db.session(write=True):
        went_on.append(turns)


async def test_a_cancel_as_the_write_turn_is_granted_is_not_swallowed(db: Database) -> None:
    cases: list[tuple[bool, bool]] = []  # (the writer queued for its turn, its write had begun when cancelled)
    for turns in OFFSETS:
        entered, release = asyncio.Event(), asyncio.Event()
        went_on: list[int] = []

        held = asyncio.create_task(hold(db, entered, release))
        await entered.wait()
        waiting = asyncio.create_task(write(db, went_on, turns))
        # Queued behind the holder for its turn (or, without a turn lock, gone on).
        await until(
            lambda: turn_waiters(db) or went_on,  # noqa: B023
            timeout=10,
            what="the writer to queue for its turn",
        )
        queued = turn_waiters(db) > 0
        release.set()
        for _ in range(turns):
            await asyncio.sleep(0)  # the offset, in loop turns (no time passes)
        before = bool(went_on)
        waiting.cancel()
        await held
        try:
            await waiting
            ended = "finished"
        except asyncio.CancelledError:
            ended = "cancelled"
        cases.append((queued, before))
        # What the caller sees: a write cancelled before it began ends cancelled and never runs;
        # one that had begun ran once (whether its commit was then cancelled or not).
        assert ended == "cancelled" or before, f"cancel lost {turns} turns after the grant: the write went on"
        assert went_on == ([turns] if before else []), f"the write ran {went_on} with the cancel {turns} turns late"
    # Where writers queue for their turn (SQLite), the first offsets cancel before the write
    # begins: the race this test is about was run, not only the writes that had gone on.
    waited = [before for queued, before in cases if queued]
    assert not waited or not all(waited), "no offset cancelled a queued writer before its write began"


async def test_closing_a_writer_as_its_turn_comes_up_returns_with_every_event(settings: Settings, db: Database) -> None:
    await seed(settings)
    task_id, _, _ = await start_task(settings, db)
    async with db.session() as s:
        before = int(await s.scalar(select(func.count()).where(TranscriptEvent.task_id == task_id)) or 0)
    for turns in OFFSETS:
        writer = TranscriptWriter(db, LiveHub(), task_id, None, Redactor([]), flush_interval=0.0)
        writer.start()
        entered, release = asyncio.Event(), asyncio.Event()
        held = asyncio.create_task(hold(db, entered, release))
        await entered.wait()
        stored = writer.count
        await writer.emit("notice", Notice(text=f"event {turns}"))
        # The writer's loop waits for the write turn (or, without a turn lock, has stored it).
        await until(
            lambda: turn_waiters(db) or writer.count > stored,  # noqa: B023
            timeout=10,
            what="the writer's loop to wait for the write turn",
        )
        release.set()
        for _ in range(turns):
            await asyncio.sleep(0)  # the offset, in loop turns (no time passes)
        async with asyncio.timeout(10):  # before the fix: for ever, at some offsets
            await writer.close()
        await held
    async with db.session() as s:
        texts = (
            await s.execute(
                select(TranscriptEvent.payload).where(TranscriptEvent.task_id == task_id).order_by(TranscriptEvent.seq)
            )
        ).scalars()
        stored = [p["text"] for p in texts][before:]
    assert stored == [f"event {t}" for t in OFFSETS]  # each once, in order
