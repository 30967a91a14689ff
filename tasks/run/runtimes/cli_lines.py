"""A CLI agent's stdout as JSON lines, shared by the CLI runtimes (claude-code, codex): a reader that
queues the process's lines as they were read (None at the end), and each line kept for the raw
artefact and decoded.

Lines are decoded with msgspec (about 7x faster than `json.loads` on the CLIs' lines, which is most
of the per-line cost of a stream's normalisation); it is stricter too: `NaN`, numbers out of a
float's range and lone surrogate escapes make a line undecodable, so it is kept raw and skipped."""

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator, Sequence
from typing import Any, Protocol

import msgspec

from tasks.core.capping import HeadTail

# next_lines hands over at most this many lines, handed to the transcript writer in one call:
# bigger batches store faster and show later (tests/bench/bench_codex_stream.py, measured while the
# stream waited for each store: 512 lines 0.92x-0.94x the builtin path's events per second, 1,024
# lines 1.17x-1.25x, 2,048 lines 1.4x-1.6x with the first event of a batch some 90 ms late; since
# the writer stores a full buffer while the next lines are read, 1,024 lines give 1.40x-1.53x), and
# a read of the pipe full of short lines must not be one transaction.
BATCH_LINES = 1024


class LineBatches(Protocol):
    """What `Sandbox.spawn` gives (and the tests' host process): stdout as lists of lines, the lines
    one read of the pipe completed."""

    def stdout_batches(self) -> AsyncIterator[Sequence[bytes]]: ...


class StdoutReader:
    """The process's stdout lines, read in the background until it ends. Lines are queued as the
    batches they were read in: a busy stream costs a queue hop a read of the pipe, not one a line."""

    def __init__(self, proc: LineBatches) -> None:
        # Bounded: a CLI flooding stdout waits for the reader instead of growing the worker's memory
        # (a batch is at most one read of the pipe, 256 KiB, plus one line up to the line cap).
        self._batches: asyncio.Queue[Sequence[bytes] | None] = asyncio.Queue(maxsize=4)
        self._taken: deque[bytes] = deque()  # the rest of a batch next_line started
        self._ended = False  # the end marker was taken
        self._source_ended = False
        self._task = asyncio.ensure_future(self._read(proc.stdout_batches()))

    async def _read(self, source: AsyncIterator[Sequence[bytes]]) -> None:
        try:
            async for batch in source:
                if batch:
                    await self._batches.put(batch)
        finally:
            # Never waits for room: close() cancels this task while the queue may be full (and
            # nobody takes from it any more). A full queue ends through `_source_ended` instead.
            self._source_ended = True
            with contextlib.suppress(asyncio.QueueFull):
                self._batches.put_nowait(None)

    async def _next_batch(self, timeout: float | None) -> Sequence[bytes] | None:  # noqa: ASYNC109
        if self._ended:
            return None
        try:
            batch = self._batches.get_nowait()
        except asyncio.QueueEmpty:
            if self._source_ended:  # its end marker found no room
                self._ended = True
                return None
            async with asyncio.timeout(timeout):
                batch = await self._batches.get()
        if batch is None:
            self._ended = True
        return batch

    async def next_line(self, timeout: float) -> bytes | None:  # noqa: ASYNC109
        """The next line (None once stdout ended); TimeoutError after `timeout` s of silence. A
        line already read is taken without arming a timer (a busy stream's common case)."""
        if not self._taken:
            batch = await self._next_batch(timeout)
            if batch is None:
                return None
            self._taken.extend(batch)
        return self._taken.popleft()

    async def next_lines(self, timeout: float | None) -> list[bytes] | None:  # noqa: ASYNC109
        """The lines read and not yet taken, at least one (waiting up to `timeout` s for it, else
        TimeoutError; a `timeout` of None waits as long as it takes) and at most `BATCH_LINES`;
        None once stdout ended and every line was taken. A busy stream's lines are normalised and
        handed to the transcript writer together (one call)."""
        if not self._taken:
            first = await self._next_batch(timeout)
            if first is None:
                return None
            self._taken.extend(first)
        while not self._ended and len(self._taken) < BATCH_LINES:
            try:
                batch = self._batches.get_nowait()
            except asyncio.QueueEmpty:
                break
            if batch is None:
                self._ended = True
            else:
                self._taken.extend(batch)
        if len(self._taken) <= BATCH_LINES:
            out = list(self._taken)
            self._taken.clear()
            return out
        return [self._taken.popleft() for _ in range(BATCH_LINES)]

    async def close(self) -> None:
        self._task.cancel()
        # asyncio.wait: the reader's own end (cancelled, or the process's error) is not raised
        # here, and a cancel of close()'s caller still reaches the caller.
        await asyncio.wait([self._task])
        if not self._task.cancelled():
            self._task.exception()  # the process's error, taken: the run saw its output end


_decode = msgspec.json.Decoder()


def json_object(raw: bytes) -> dict[str, Any] | None:
    """A line decoded when it is one JSON object; None for anything else."""
    try:
        line = _decode.decode(raw)
    except msgspec.DecodeError:
        return None
    return line if isinstance(line, dict) else None


def keep_lines(lines: Sequence[bytes], kept: HeadTail) -> None:
    """Lines read together (without their newlines), kept for the raw stream artefact with one copy.
    (The caller decodes them one at a time: a batch's decoded objects all alive at once would
    outlive the collector's youngest generation and make its full collections come sooner.)"""
    kept.add(b"\n".join(lines) + b"\n")


def json_line(raw: bytes, kept: HeadTail) -> dict[str, Any] | None:
    """One stdout line: kept (capped) for the raw stream artefact, decoded when it is a JSON object."""
    kept.add(raw if raw.endswith(b"\n") else raw + b"\n")
    return json_object(raw)
