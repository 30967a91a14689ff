"""The output pump of one exec: a thread reads Docker's multiplexed stream and hands chunks to the
event loop through a bounded channel (backpressure instead of dropping), and a thread feeds stdin.
Used by `sandbox.commands.ExecStream`."""

import asyncio
import contextlib
import socket
import threading
from collections.abc import Iterator
from typing import Any, Literal

import msgspec

StreamName = Literal["stdout", "stderr"]
PID_MARKER = b"\x1eforgehand-pid:"
_STREAMS: dict[int, StreamName] = {1: "stdout", 2: "stderr"}
_RECV_SIZE = 256 * 1024
_POLL = 0.2  # how often blocked threads look at their cancel flag


class OutputChunk(msgspec.Struct, frozen=True):
    stream: StreamName
    data: bytes


class End:
    """Marks the end of the output (or the pump's failure)."""

    def __init__(self, error: BaseException | None = None) -> None:
        self.error = error


class Channel:
    """Thread -> event loop queue, bounded by a semaphore so the producing thread blocks when full."""

    def __init__(self, loop: asyncio.AbstractEventLoop, max_items: int) -> None:
        self._loop = loop
        self._queue: asyncio.Queue[OutputChunk | End] = asyncio.Queue()
        self._slots = threading.Semaphore(max_items)
        self.abandoned = threading.Event()

    def put(self, item: OutputChunk) -> bool:
        while not self._slots.acquire(timeout=_POLL):
            if self.abandoned.is_set():
                return False
        if self.abandoned.is_set():
            return False
        self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        return True

    def end(self, item: End) -> None:
        with contextlib.suppress(RuntimeError):  # the loop may be closed already
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)

    async def get(self) -> OutputChunk | End:
        item = await self._queue.get()
        if isinstance(item, OutputChunk):
            self._slots.release()
        return item


def raw_socket(sock: Any) -> Any:
    """The OS socket under what docker-py's exec attach returns (`exec_start(socket=True)`).

    docker-py hands out a `socket.SocketIO` wrapper (or, over some transports, the socket itself)
    and offers no public way to reach the socket below; reading frames with timeouts, half-closing
    stdin and shutting both ways down need it, so this is the one place that looks at the
    wrapper's `_sock`. None once the wrapper was closed."""
    return getattr(sock, "_sock", sock)


def prebuffered(sock: Any, *, timeout: float | None) -> bytes:
    """The first bytes of the exec's stream when http.client read them into its buffer along with the
    upgrade response's headers (the engine wrote both before this process read the response): a read
    of the socket below never sees them. Call before anything reads the socket; it is left with
    `timeout`."""
    fp = getattr(getattr(getattr(getattr(sock, "_response", None), "raw", None), "_fp", None), "fp", None)
    if fp is None:
        return b""
    raw = raw_socket(sock)
    raw.setblocking(False)
    try:
        data: bytes = fp.peek(_RECV_SIZE)
        if data:
            fp.read(len(data))
    except (OSError, ValueError):
        data = b""
    finally:
        raw.settimeout(timeout)
    return data


class Frames:
    """Docker's multiplexed stream (an 8-byte header, then the payload, per frame) split into
    (stream, piece of payload), whatever the reads cut: the state carries from one read to the next."""

    def __init__(self) -> None:
        self._header = bytearray()
        self._remaining = 0
        self._stream = 1

    def split(self, data: memoryview) -> Iterator[tuple[int, memoryview]]:
        n, pos = len(data), 0
        while pos < n:
            if self._remaining == 0:
                take = min(8 - len(self._header), n - pos)
                self._header += data[pos : pos + take]
                pos += take
                if len(self._header) == 8:
                    self._stream = self._header[0]
                    self._remaining = int.from_bytes(self._header[4:8], "big")
                    self._header.clear()
                continue
            take = min(self._remaining, n - pos)
            yield self._stream, data[pos : pos + take]
            pos += take
            self._remaining -= take


def read_stdout(sock: Any, cap: int) -> bytes:
    """The stdout (stream 1) of an exec started with `exec_start(socket=True)`, its first `cap` bytes,
    read to the end of the stream (blocking, with the socket's own timeout), the bytes http.client
    buffered first. docker-py's own read (`exec_start()` without `socket`) reads the socket below
    and loses those: a short command's whole output when the reading thread was slow to get to it."""
    raw: socket.socket = raw_socket(sock)
    data = prebuffered(sock, timeout=raw.gettimeout())
    out = bytearray()
    frames = Frames()
    while True:
        if not data:
            data = raw.recv(_RECV_SIZE)
            if not data:
                return bytes(out)
        for stream, piece in frames.split(memoryview(data)):
            if stream == 1 and len(out) < cap:
                out += piece[: cap - len(out)]
        data = b""


class Pump:
    """Reads Docker's multiplexed stream (8-byte frame headers) in a thread; applies the output cap."""

    def __init__(self, sock: Any, channel: Channel, cap: int) -> None:
        self._sock = sock
        self._raw: socket.socket = raw_socket(sock)
        self._channel = channel
        self._cap = cap
        self.delivered = 0
        self.truncated = 0
        self.pid: int | None = None
        self._marker_pending = True
        self._marker_buf = b""
        self._pending = b""
        self.cancel = threading.Event()
        self.thread = threading.Thread(target=self._run, name="forgehand-exec-pump", daemon=True)

    def take_prebuffered(self) -> None:
        """Call before any thread touches the socket (it briefly makes the socket non-blocking)."""
        self._pending = prebuffered(self._sock, timeout=_POLL)

    def _run(self) -> None:
        error: BaseException | None = None
        frames = Frames()
        buf = bytearray(_RECV_SIZE)
        try:
            pending, self._pending = self._pending, b""
            self._raw.settimeout(_POLL)
            while not self.cancel.is_set():
                if pending:
                    data, pending = memoryview(pending), b""
                    n = len(data)
                else:
                    try:
                        n = self._raw.recv_into(buf)
                    except TimeoutError:
                        continue
                    except OSError:
                        break  # closed by cancel, or the engine went away
                    if n == 0:
                        break
                    data = memoryview(buf)[:n]
                for stream, piece in frames.split(data[:n]):
                    if self.delivered >= self._cap and not self._marker_pending:
                        self.truncated += len(piece)  # past the cap: count it, don't even copy it
                        continue
                    if not self._deliver(stream, bytes(piece)):
                        return
        except BaseException as exc:  # reported to the consumer, never lost in a thread
            error = exc
        finally:
            self._channel.end(End(error))

    def _deliver(self, stream: int, payload: bytes) -> bool:
        if stream == 2 and self._marker_pending:
            payload = self._take_marker(payload)
            if not payload:
                return True
        name = _STREAMS.get(stream)
        if name is None:
            return True  # stdin echo (0) never happens without a tty; ignore anything else
        room = self._cap - self.delivered
        if room <= 0:
            self.truncated += len(payload)
            return True
        if len(payload) > room:
            self.truncated += len(payload) - room
            payload = payload[:room]
        self.delivered += len(payload)
        return self._channel.put(OutputChunk(name, payload))

    def _take_marker(self, payload: bytes) -> bytes:
        self._marker_buf += payload
        if len(self._marker_buf) < len(PID_MARKER) and PID_MARKER.startswith(self._marker_buf):
            return b""  # the marker was split across frames; wait for more
        self._marker_pending = False
        buf, self._marker_buf = self._marker_buf, b""
        if not buf.startswith(PID_MARKER):
            return buf  # no wrapper (sh missing?): everything is output
        line, nl, rest = buf[len(PID_MARKER) :].partition(b"\n")
        if not nl:
            self._marker_pending = True
            self._marker_buf = buf
            return b""
        with contextlib.suppress(ValueError):
            self.pid = int(line)
        return rest


class StdinWriter:
    def __init__(self, sock: Any, data: bytes, cancel: threading.Event) -> None:
        self._raw: socket.socket = raw_socket(sock)
        self._data = data
        self._cancel = cancel
        self.thread = threading.Thread(target=self._run, name="forgehand-exec-stdin", daemon=True)

    def _run(self) -> None:
        view = memoryview(self._data)
        off = 0
        try:
            while off < len(view) and not self._cancel.is_set():
                try:
                    off += self._raw.send(view[off : off + _RECV_SIZE])
                except (TimeoutError, BlockingIOError):
                    continue
            # Half-close: the command sees end of input, its output keeps coming.
            self._raw.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the exec ended or was cancelled before reading all of its input
