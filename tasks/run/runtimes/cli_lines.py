"""A CLI agent's stdout as JSON lines, shared by the CLI runtimes (claude-code, codex): a reader that
queues the process's lines (None at the end), and each line kept for the raw artefact and decoded.

Lines are decoded with msgspec (about 7x faster than `json.loads` on the CLIs' lines, which is most
of the per-line cost of a stream's normalisation); it is stricter too: `NaN`, numbers out of a
float's range and lone surrogate escapes make a line undecodable, so it is kept raw and skipped."""

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import msgspec

from tasks.core.transcript import HeadTail


class StdoutReader:
    """The process's stdout lines on a queue, read in the background until it ends."""

    def __init__(self, proc: Any) -> None:
        # Bounded: a CLI flooding stdout waits for the reader instead of growing the worker's memory.
        self.lines: asyncio.Queue[bytes | None] = asyncio.Queue(maxsize=256)
        self._ended = False  # next_lines took the end marker
        self._task = asyncio.ensure_future(self._read(proc.stdout_lines()))

    async def _read(self, source: AsyncIterator[Any]) -> None:
        try:
            async for raw in source:
                await self.lines.put(bytes(raw))
        finally:
            await self.lines.put(None)

    async def next_line(self, timeout: float) -> bytes | None:  # noqa: ASYNC109
        """The next line (None once stdout ended); TimeoutError after `timeout` s of silence. A
        line already queued is taken without arming a timer (a busy stream's common case)."""
        try:
            return self.lines.get_nowait()
        except asyncio.QueueEmpty:
            async with asyncio.timeout(timeout):
                return await self.lines.get()

    async def next_lines(self, timeout: float) -> list[bytes] | None:  # noqa: ASYNC109
        """Every line queued now, at least one (waiting up to `timeout` s for it, else
        TimeoutError); None once stdout ended and every line was taken. A busy stream's lines are
        normalised and stored together (one call to the transcript writer)."""
        if self._ended:
            return None
        first = await self.next_line(timeout)
        if first is None:
            return None
        out = [first]
        while True:
            try:
                raw = self.lines.get_nowait()
            except asyncio.QueueEmpty:
                return out
            if raw is None:
                self._ended = True
                return out
            out.append(raw)

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(BaseException):
            await self._task


_decode = msgspec.json.Decoder()


def json_object(raw: bytes) -> dict[str, Any] | None:
    """A line decoded when it is one JSON object; None for anything else."""
    try:
        line = _decode.decode(raw)
    except msgspec.DecodeError:
        return None
    return line if isinstance(line, dict) else None


def json_line(raw: bytes, kept: HeadTail) -> dict[str, Any] | None:
    """One stdout line: kept (capped) for the raw stream artefact, decoded when it is a JSON object."""
    kept.add(raw if raw.endswith(b"\n") else raw + b"\n")
    return json_object(raw)
