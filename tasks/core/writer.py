"""The run's transcript writer: redacts, batches and stores events, then wakes live readers.

Output chunks are redacted as a stream (a secret split across two chunks is still caught),
batched for a few milliseconds and written in one transaction, so a command printing hundreds of
thousands of lines costs a handful of writes per second, not one per line. A CLI stream's batch
(`emit_many`) that fills the buffer is stored at once by the writer's loop while the stream's next
lines are read and normalised: the store's commit and the reading overlap (tests/bench/bench_acp.py
and bench_codex_stream.py measure it); one event at a time (`emit`) waits for the store when the
buffer is full, as the builtin loop's few events a second never notice."""

import asyncio
import contextlib
import time
from collections.abc import Iterable
from datetime import datetime

import msgspec
import structlog

from forge.db.engine import Database, utcnow
from tasks.core import transcript
from tasks.core.capping import STREAM_STORE_CAP, StoredCap
from tasks.core.live import LiveHub
from tasks.core.redaction import Redactor, redacted_json
from tasks.core.transcript import Kind, Output, Payload, Pending

log = structlog.get_logger("forgehand.tasks")

_STREAMS = ("stdout", "stderr")
# emit_many hands a full buffer to the loop and goes on; it waits for the store only once this many
# buffers' worth piled up, or this many bytes of JSON (an agent printing big events must not make
# the worker hold thousands of them). The store under way is not counted: the worker holds up to
# about twice the bound.
BEHIND = 4
BEHIND_BYTES = 16 * 1024 * 1024
MAX_EVENT_TEXT = 64 * 1024


class TranscriptWriter:
    def __init__(
        self,
        db: Database,
        hub: LiveHub,
        task_id: int,
        run_id: int | None,
        redactor: Redactor,
        *,
        flush_interval: float = 0.05,
        max_buffer: int = 512,
        behind_bytes: int = BEHIND_BYTES,
        stream_cap: int = STREAM_STORE_CAP,
    ) -> None:
        self.db = db
        self.hub = hub
        self.task_id = task_id
        self.run_id = run_id
        self.redactor = redactor
        self.flush_interval = flush_interval
        self.max_buffer = max_buffer
        self.behind_bytes = behind_bytes
        self._buffer: list[Pending] = []
        self._buffered_bytes = 0  # the JSON emit_many buffered since the last store began
        self.stored_cap = StoredCap(stream_cap)  # stdout and stderr as stored, together
        self._dropped: dict[Kind, int] = {}  # bytes past the cap, per stream, told at close
        self._kick = asyncio.Event()
        self._now = asyncio.Event()  # a batch filled the buffer: the loop flushes without its pause
        self._lock = asyncio.Lock()
        self._loop_task: asyncio.Task[None] | None = None
        self._closing = False
        self.last_activity = time.monotonic()
        self.count = 0

    def start(self) -> None:
        self._loop_task = asyncio.create_task(self._loop())

    def touch(self) -> None:
        self.last_activity = time.monotonic()

    def _redacted(self, out: list[Pending], kind: Kind, payload: Payload, at: datetime) -> None:
        if isinstance(payload, Output) and kind in _STREAMS:
            self._stream(out, kind, self.redactor.feed(kind, payload.text), payload.omitted_bytes, at)
            return
        self._end_streams(out, at)
        encoded = redacted_json(self.redactor, payload)
        out.append(Pending(kind=kind, payload=payload, run_id=self.run_id, at=at, encoded=encoded))

    def _stream(self, out: list[Pending], kind: Kind, text: str, omitted: int, at: datetime) -> None:
        """Output as stored: within the run's stored cap (`StoredCap`); past it, only counted, and
        the count told once, when the writer closes."""
        text, dropped = self.stored_cap.take(text)
        if dropped and not text:
            self._dropped[kind] = self._dropped.get(kind, 0) + dropped + omitted
            return
        if text or omitted or dropped:
            output = Output(text=text, omitted_bytes=omitted + dropped)
            out.append(Pending(kind=kind, payload=output, run_id=self.run_id, at=at))

    def _end_streams(self, out: list[Pending], at: datetime) -> None:
        """Anything but output ends the output streams: what they held back goes first."""
        if self.redactor.holding:
            for stream in _STREAMS:
                self._stream(out, stream, self.redactor.flush(stream), 0, at)  # type: ignore[arg-type]

    async def emit(self, kind: Kind, payload: Payload, *, activity: bool = True) -> None:
        if activity:
            self.touch()
        self._redacted(self._buffer, kind, payload, utcnow())
        await self._queued()

    async def emit_many(self, events: Iterable[tuple[Kind, Payload]]) -> None:
        """Several events that arrived together (the lines a CLI printed at once), in order: one
        timestamp for all of them (they were read in the same instant) and one look at the buffer."""
        self.touch()
        at = utcnow()
        batch = list(events)
        if any(isinstance(payload, Output) for _, payload in batch):  # streams: one by one
            for kind, payload in batch:
                self._redacted(self._buffer, kind, payload, at)
        elif batch:
            self._end_streams(self._buffer, at)
            # One look for secrets over the whole batch's JSON. A line break joins them: msgspec
            # never writes one raw, so no secret is found across two payloads (a secret holding
            # one is no literal needle, and then every payload is walked).
            encoded = [msgspec.json.encode(payload) for _, payload in batch]
            if not self.redactor.clean(b"\n".join(encoded)):
                encoded = [redacted_json(self.redactor, payload) for _, payload in batch]
            self._buffer += [
                Pending(kind=kind, payload=payload, run_id=self.run_id, at=at, encoded=data)
                for (kind, payload), data in zip(batch, encoded, strict=True)
            ]
            self._buffered_bytes += sum(len(data) for data in encoded)
        if len(self._buffer) >= BEHIND * self.max_buffer or self._buffered_bytes >= self.behind_bytes:
            await self.flush()  # this far behind, the stream waits (the worker's memory stays bounded)
        elif len(self._buffer) >= self.max_buffer and self._loop_running():
            # A stream's batch filled the buffer: the loop stores it now while the caller reads and
            # normalises the next lines (the store's commit and the pipe's next lines overlap).
            self._now.set()
            self._kick.set()
        else:
            await self._queued()

    def _loop_running(self) -> bool:
        return self._loop_task is not None and not self._loop_task.done() and not self._closing

    async def _queued(self) -> None:
        if len(self._buffer) >= self.max_buffer:
            await self.flush()
        elif self._buffer:
            self._kick.set()

    async def _loop(self) -> None:
        while not self._closing:
            await self._kick.wait()
            self._kick.clear()
            if self._closing:
                return
            if not self._now.is_set():
                with contextlib.suppress(TimeoutError):  # a few ms for more events, unless one is full
                    async with asyncio.timeout(self.flush_interval):
                        await self._now.wait()
            self._now.clear()
            try:
                await self.flush()
            except Exception:  # the next flush retries what is still buffered
                log.exception("transcript flush failed", task_id=self.task_id)
                if not self._closing:
                    await asyncio.sleep(0.5)

    @staticmethod
    def _coalesce(events: list[Pending]) -> list[Pending]:
        out: list[Pending] = []
        for ev in events:
            prev = out[-1] if out else None
            if (
                prev is not None
                and ev.kind in _STREAMS
                and prev.kind == ev.kind
                and isinstance(prev.payload, Output)
                and isinstance(ev.payload, Output)
                and not prev.payload.omitted_bytes
                and not ev.payload.omitted_bytes
                and len(prev.payload.text) + len(ev.payload.text) <= MAX_EVENT_TEXT
            ):
                out[-1] = Pending(
                    kind=prev.kind,
                    payload=Output(text=prev.payload.text + ev.payload.text),
                    run_id=prev.run_id,
                    at=prev.at,
                )
            else:
                out.append(ev)
        return out

    async def flush(self) -> None:
        async with self._lock:
            if not self._buffer:
                return
            events, self._buffer = self._coalesce(self._buffer), []
            self._buffered_bytes = 0
            # The store is a task of its own, waited for to its end even when the caller is
            # cancelled (the lock held meanwhile, so the order stays): a cancel landing between a
            # transaction's commit and its return put the events back, and they were stored twice.
            store = asyncio.ensure_future(self._store(events))
            cancelled = False
            while not store.done():
                try:
                    await asyncio.wait([store])  # never cancels the store
                except asyncio.CancelledError:
                    cancelled = True
            if store.cancelled() or store.exception() is not None:
                self._buffer[:0] = events
                self._buffered_bytes = sum(len(p.encoded) for p in self._buffer)
                if not cancelled:
                    store.result()  # the store's error, to the caller
            else:
                self.count += len(events)
                self.hub.notify(self.task_id)
        if cancelled:
            raise asyncio.CancelledError

    async def _store(self, events: list[Pending]) -> None:
        async with self.db.session(write=True) as session:
            await transcript.append(session, self.task_id, events)

    async def close(self) -> None:
        at = utcnow()
        for stream in _STREAMS:
            self._stream(self._buffer, stream, self.redactor.flush(stream), 0, at)  # type: ignore[arg-type]
        for stream, dropped in self._dropped.items():
            told = Output(text="", omitted_bytes=dropped)
            self._buffer.append(Pending(kind=stream, payload=told, run_id=self.run_id))
        self._dropped.clear()
        if self._loop_task is not None:
            # The loop is told to end, not cancelled: a cancel could land inside a flush's
            # transaction (once, under load, the next write then waited out SQLite's busy timeout).
            # A cancel of close()'s own caller goes on to the caller (asyncio.wait does not swallow it).
            self._closing = True
            self._now.set()  # a pause for more events ends now
            self._kick.set()
            await asyncio.wait([self._loop_task])
        await self.flush()
