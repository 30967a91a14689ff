"""An interactive process in a started sandbox: stdin written while it runs, stdout read as lines.

    async with await sb.spawn(["claude", "-p", ...], env=..., timeout=3600) as p:
        await p.write(b'{"type": "user", ...}\\n')
        async for line in p.stdout_lines():      # bytes, without the newline
            if truncated(line): ...               # longer than line_cap: cut there (a CutLine)
        # or p.stdout_batches(): the lines one read of the pipe completed, as one list
        await p.close_stdin()
        code = await p.wait()                     # int, or None when it could not be reaped

It is the same docker exec as `Sandbox.stream` (commands.py: the wrapper with its pid marker, the
process-tree kill, the in-container timeout; pump.py: the reader thread and its bounded channel),
with stdin kept open on the exec's socket. Memory stays bounded whatever the process prints: a line
is held up to `line_cap` bytes (the rest of it is counted and dropped), the lines of at most
`queue_batches` reads of the pipe wait for the consumer, and stderr keeps only its last `stderr_cap`
bytes. A slow consumer slows the process down (its stdout pipe fills) instead of losing lines. The
process is killed at its timeout, by `kill()` or leaving the `async with`, and ends with the
sandbox: when the sandbox is removed its readers end (no hang), and `wait()` returns None.
"""

import asyncio
import contextlib
import socket
import time
import weakref
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from .commands import close_exec_socket, exec_exit_code, kill_exec, open_exec, wrapped
from .errors import ProcessEnded
from .protocols import StartedSandbox
from .pump import Channel, End, Pump, raw_socket

DEFAULT_LINE_CAP = 4 << 20
DEFAULT_STDERR_CAP = 64 << 10
_NO_TOTAL_CAP = 1 << 62  # the pump's total cap: an agent may print gigabytes over hours, line by line
_SEND_SIZE = 64 << 10


class CutLine(bytes):
    """A line of stdout that was longer than the cap, cut there (`dropped` bytes past the cap were
    read and discarded). Whole lines are plain bytes: a bytes subclass's instances are tracked by
    the garbage collector, and thousands of them a second alive in the queues made its full
    collections (a fifth of a second in a worker) come several times as often."""

    truncated = True
    dropped: int

    def __new__(cls, data: bytes | bytearray, dropped: int) -> "CutLine":
        line = super().__new__(cls, data)
        line.dropped = dropped
        return line


def truncated(line: bytes) -> bool:
    """The line was cut at the process's line cap."""
    return isinstance(line, CutLine)


class LineSplitter:
    """Splits stdout chunks into capped lines; counts the lines it cut (`truncated`)."""

    def __init__(self, cap: int) -> None:
        self._cap = cap
        self._buf = bytearray()
        self._dropped = 0
        self.truncated = 0

    def feed(self, data: bytes) -> list[bytes]:
        out: list[bytes] = []
        view = memoryview(data)
        start = 0
        while True:
            nl = data.find(b"\n", start)
            if nl >= 0 and not self._buf and not self._dropped and nl - start <= self._cap:
                # A whole line inside this chunk (the common case): one copy, straight from the chunk.
                out.append(bytes(view[start:nl]))
                start = nl + 1
                continue
            piece = view[start:] if nl < 0 else view[start:nl]
            room = self._cap - len(self._buf)
            if len(piece) > room:
                self._dropped += len(piece) - max(room, 0)
                piece = piece[: max(room, 0)]
            self._buf += piece
            if nl < 0:
                return out
            out.append(self._take())
            start = nl + 1

    def flush(self) -> bytes | None:
        if not self._buf and not self._dropped:
            return None
        return self._take()

    def _take(self) -> bytes:
        if self._dropped:
            self.truncated += 1
            line: bytes = CutLine(self._buf, self._dropped)
        else:
            line = bytes(self._buf)
        self._buf = bytearray()
        self._dropped = 0
        return line


class SandboxProcess:
    """A process started by `Sandbox.spawn`. Await it (or `async with` it) to start it; the first
    `write` or `stdout_lines` starts it too."""

    def __init__(
        self,
        sandbox: StartedSandbox,
        argv: list[str],
        *,
        env: list[str] | None,
        cwd: str,
        timeout: float,
        line_cap: int = DEFAULT_LINE_CAP,
        stderr_cap: int = DEFAULT_STDERR_CAP,
        queue_batches: int = 16,
        kill_grace: float = 5.0,
    ) -> None:
        self._sb = sandbox
        self._argv = argv
        self._env = env
        self._cwd = cwd
        self.timeout = timeout
        self._line_cap = line_cap
        self._stderr_cap = stderr_cap
        self._kill_grace = kill_grace
        # A batch is the lines one read of the pipe completed: a busy stream costs one queue hop a
        # read, not one a line (a CLI printing thousands of JSON lines a second).
        self._lines: asyncio.Queue[list[bytes] | End] = asyncio.Queue(maxsize=max(1, queue_batches))
        self._stderr = bytearray()
        self._start_lock = asyncio.Lock()
        self._write_lock = asyncio.Lock()
        self._started = False
        self._stdin_closed = False
        self._exited = asyncio.Event()
        self._exec_id = ""
        self._sock: Any = None
        self._pump: Pump | None = None
        self._reader: asyncio.Task[None] | None = None
        self._watchdog: asyncio.Task[None] | None = None
        self._discard = False  # wait() without a reader: lines nobody will read are dropped
        self._closing = False  # aclose(): every line from now on is dropped
        self._output_ended = False
        self._iterating = 0
        self._error: BaseException | None = None
        self.returncode: int | None = None
        self.timed_out = False
        self.killed = False
        self.truncated_lines = 0
        self.started_at = 0.0

    # -- starting and ending ------------------------------------------------------------------

    def __await__(self) -> Any:
        return self._started_self().__await__()

    async def _started_self(self) -> "SandboxProcess":
        await self.start()
        return self

    async def __aenter__(self) -> "SandboxProcess":
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def start(self) -> None:
        async with self._start_lock:
            if self._started:
                return
            self._started = True
            self.started_at = time.monotonic()
            try:
                self._exec_id, self._sock = await open_exec(
                    self._sb, wrapped(self._argv, self.timeout), env=self._env, cwd=self._cwd, stdin=True
                )
            except BaseException:
                self._never_ran()
                raise
            channel = Channel(asyncio.get_running_loop(), 16)
            self._pump = Pump(self._sock, channel, _NO_TOTAL_CAP)
            self._pump.take_prebuffered()
            weakref.finalize(self, channel.abandoned.set)
            weakref.finalize(self, self._pump.cancel.set)
            self._pump.thread.start()
            self._reader = asyncio.create_task(self._read(channel))
            self._watchdog = asyncio.create_task(self._watch())
            self._sb.track(self)

    @property
    def running(self) -> bool:
        return self._started and not self._exited.is_set()

    @property
    def stderr_tail(self) -> str:
        """The last `stderr_cap` bytes of stderr, decoded (undecodable bytes replaced)."""
        return bytes(self._stderr).decode("utf-8", errors="replace")

    async def wait(self) -> int | None:
        """Wait for the exit; returns the exit code (None when it could not be known: the sandbox
        went away). Lines nobody is reading from then on are discarded."""
        await self.start()
        self._discard = True
        if not self._iterating:
            self._drain()
        await self._exited.wait()
        if self._error is not None:
            raise self._error
        return self.returncode

    async def kill(self) -> None:
        """Kill the process and everything it started; returns once it has ended (bounded)."""
        if not self._started or self._exited.is_set():
            return
        self.killed = True
        await self._terminate()

    async def _terminate(self) -> None:
        await kill_exec(self._sb, self._pump)
        # Give the output a moment to end after the kill; then stop reading whatever is left
        # (a process that slipped out of the kill and still holds the pipe).
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._kill_grace):
                await self._exited.wait()
        self._stop_reading()

    async def aclose(self) -> None:
        """Kill the process if it still runs and release everything."""
        if not self._started:
            self._started = True  # never start it after this
            self._never_ran()
            return
        self._closing = True
        self._drain()
        if not self._exited.is_set():
            await self.kill()
        self._stop_reading()
        if self._watchdog is not None:
            self._watchdog.cancel()
        if self._reader is not None:
            self._drain()
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                async with asyncio.timeout(self._kill_grace):
                    await asyncio.shield(self._reader)

    def _never_ran(self) -> None:
        # Readers and waiters end at once (no output, no exit code).
        self._output_ended = True
        self._lines.put_nowait(End())
        self._exited.set()

    def sandbox_removed(self) -> None:
        """Called by Sandbox.remove: stop reading a stream that no process writes to any more."""
        self._stop_reading()

    def _stop_reading(self) -> None:
        if self._pump is not None:
            self._pump.cancel.set()
        close_exec_socket(self._sock)

    # -- stdin --------------------------------------------------------------------------------

    async def write(self, data: bytes) -> None:
        """Send bytes to the process's stdin; waits while the process is not reading (backpressure).

        Raises ProcessEnded when stdin was closed or the process has ended.
        """
        await self.start()
        async with self._write_lock:
            if self._stdin_closed or self._exited.is_set():
                raise ProcessEnded("the process's stdin is closed" if self._stdin_closed else "the process has ended")
            try:
                await asyncio.to_thread(self._send_all, bytes(data))
            except OSError as exc:
                raise ProcessEnded(f"the process no longer reads its stdin: {exc}") from exc

    def _send_all(self, data: bytes) -> None:
        raw = raw_socket(self._sock)
        view = memoryview(data)
        off = 0
        while off < len(view):
            if self._exited.is_set() or (self._pump is not None and self._pump.cancel.is_set()):
                raise BrokenPipeError("the process has ended")
            try:
                off += raw.send(view[off : off + _SEND_SIZE])
            except (TimeoutError, BlockingIOError):
                continue  # the socket's timeout is the pump's poll interval: look at the flags again

    async def close_stdin(self) -> None:
        """End of input for the process (a half-close: its output keeps coming). Idempotent."""
        await self.start()
        async with self._write_lock:
            if self._stdin_closed:
                return
            self._stdin_closed = True
            raw = raw_socket(self._sock)
            with contextlib.suppress(OSError):
                raw.shutdown(socket.SHUT_WR)

    # -- stdout -------------------------------------------------------------------------------

    async def stdout_lines(self) -> AsyncIterator[bytes]:
        """Lines of stdout as they come, until the process's output ends. One reader at a time."""
        async with contextlib.aclosing(self.stdout_batches()) as batches:
            async for batch in batches:
                for line in batch:
                    yield line

    async def stdout_batches(self) -> AsyncGenerator[list[bytes], None]:
        """Stdout's lines as they come, in lists (never empty): the lines one read of the pipe
        completed. Until the process's output ends; one reader at a time."""
        await self.start()
        self._iterating += 1
        try:
            while True:
                if self._output_ended and self._lines.empty():
                    break
                item = await self._lines.get()
                if isinstance(item, End):
                    with contextlib.suppress(asyncio.QueueFull):
                        self._lines.put_nowait(item)  # a later reader ends at once too
                    break
                yield item
            if self._error is not None:
                raise self._error
        finally:
            self._iterating -= 1
            if not self._iterating and (self._discard or self._closing):
                # The last reader left (a `break`) after `wait()` or `aclose()` had found it still
                # reading: the lines it would have taken are nobody's. Without this, a reader task
                # blocked on a full queue would never reach the exit, and `wait()` never return.
                self._drain()

    def _drain(self) -> None:
        while not self._lines.empty():
            self._lines.get_nowait()
        if self._output_ended:
            self._lines.put_nowait(End())

    async def _deliver(self, lines: list[bytes]) -> None:
        if self._closing or (self._discard and not self._iterating):
            self._drain()
            return
        await self._lines.put(lines)

    async def _read(self, channel: Channel) -> None:
        splitter = LineSplitter(self._line_cap)
        try:
            while True:
                item = await channel.get()
                if isinstance(item, End):
                    if item.error is not None and not (self.timed_out or self.killed):
                        self._error = item.error
                    break
                if item.stream == "stderr":
                    self._stderr += item.data
                    if len(self._stderr) > self._stderr_cap:
                        del self._stderr[: len(self._stderr) - self._stderr_cap]
                    continue
                lines = splitter.feed(item.data)
                self.truncated_lines = splitter.truncated
                if lines:
                    await self._deliver(lines)
            last = splitter.flush()
            self.truncated_lines = splitter.truncated
            if last is not None:
                await self._deliver([last])
        finally:
            channel.abandoned.set()
            close_exec_socket(self._sock)
            # A reader waiting on an empty queue wakes on the marker; with lines still queued it
            # finds `_output_ended` after the last one (so the marker never waits for room).
            self._output_ended = True
            with contextlib.suppress(asyncio.QueueFull):
                self._lines.put_nowait(End())
            try:
                self.returncode = await exec_exit_code(self._sb, self._exec_id, give_up=lambda: self.timed_out)
            finally:
                self._exited.set()
                if self._watchdog is not None:
                    self._watchdog.cancel()

    async def _watch(self) -> None:
        await asyncio.sleep(max(0.0, self.started_at + self.timeout - time.monotonic()))
        if self._exited.is_set():
            return
        self.timed_out = True
        await self._terminate()
