"""A CLI agent's stdout as JSON lines, shared by the CLI runtimes (claude-code, codex): a reader that
queues the process's lines (None at the end), and each line kept for the raw artefact and decoded."""

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

from tasks.core.transcript import HeadTail


class StdoutReader:
    """The process's stdout lines on a queue, read in the background until it ends."""

    def __init__(self, proc: Any) -> None:
        # Bounded: a CLI flooding stdout waits for the reader instead of growing the worker's memory.
        self.lines: asyncio.Queue[bytes | None] = asyncio.Queue(maxsize=256)
        self._task = asyncio.ensure_future(self._read(proc.stdout_lines()))

    async def _read(self, source: AsyncIterator[Any]) -> None:
        try:
            async for raw in source:
                await self.lines.put(bytes(raw))
        finally:
            await self.lines.put(None)

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(BaseException):
            await self._task


def json_line(raw: bytes, kept: HeadTail) -> dict[str, Any] | None:
    """One stdout line: kept (capped) for the raw stream artefact, decoded when it is a JSON object."""
    kept.add(raw if raw.endswith(b"\n") else raw + b"\n")
    try:
        line = json.loads(raw)
    except ValueError:
        return None
    return line if isinstance(line, dict) else None
