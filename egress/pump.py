"""Moving a body or a tunnel's bytes from socket to socket once the proxy has checked what the
connection may carry: no more parsing, and no Python per chunk that can be avoided.

On Linux the bytes are spliced (splice(2)) from the source socket into a kernel pipe and from the
pipe into the destination, so they never reach this process; where the kernel refuses, they are
copied through one buffer. Each direction starts on the event loop (a short exchange, an index
page, a TLS handshake costs no thread) and moves to a thread of its own after `HANDOFF` bytes: a
download then runs without a loop wake-up, a reader registered and removed, and a future per
chunk, which had halved its throughput. Measured (docs/egress.md): the loop alone kept an allowed
CONNECT's added latency lowest, threads alone gave the most throughput; this takes both.

The sockets stay non-blocking (the loop owns them again afterwards: a keep-alive connection's next
request). A thread waits with poll(2) and looks every `_POLL_SECONDS` for a stop from the loop; a
direction returns only once its thread has ended, whatever the ending, so the caller may close the
sockets after.
"""

import asyncio
import contextlib
import errno
import fcntl
import functools
import os
import select
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence

from egress.sockio import Conn

HANDOFF = 512 * 1024  # bytes a direction moves on the loop before it moves to a thread
# Directions moving in threads at once, in the whole process (every run's proxy): each holds a
# thread and a pipe of PIPE_SIZE, which count against the worker's descriptors and pipe pages.
MAX_THREADS = 64
PUMP_THREAD = "egress-pump"
PIPE_SIZE = 1024 * 1024  # the kernel pipe of a spliced direction (the default is 64 KiB)
COPY_SIZE = 256 * 1024  # the buffer where the kernel does not splice
_POLL_SECONDS = 0.2
_SPLICE_FLAGS = (os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK) if hasattr(os, "splice") else None
_UNSUPPORTED = (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP)


class _Flow:
    """What a transfer's directions share (the threads too): when a byte last moved; whether to stop."""

    __slots__ = ("last", "stop")

    def __init__(self) -> None:
        self.last = time.monotonic()
        self.stop = False


class _Stopped(Exception):
    """The loop asked a thread to stop (idle, cancelled, the other direction failed)."""


async def transfer(src: Conn, dst: Conn, count: int, idle: float) -> int:
    """Move exactly `count` bytes from src to dst (a body of known length); the number moved,
    fewer when src ended first. TimeoutError when no byte moved for `idle` seconds."""
    flow = _Flow()
    pump = asyncio.ensure_future(_direction(src, dst, count, flow))
    await _watch([pump], flow, idle)
    return pump.result()


async def tunnel(a: Conn, b: Conn, idle: float, *, opening: Callable[[], Awaitable[bytes]] | None = None) -> None:
    """Bytes both ways until both sides are done, half-closes passed on; ends when no byte moved
    in either direction for `idle` seconds (one direction may be quiet for a whole download), or
    when either side fails (a reset on one side ends both). `opening` reads a's first bytes: b
    gets them once it returns, and whatever it raises (but a timeout or a socket error) ends the
    tunnel and is raised; b's bytes flow to a meanwhile (a server may speak first)."""
    flow = _Flow()

    async def one_way(src: Conn, dst: Conn, first: Callable[[], Awaitable[bytes]] | None = None) -> int:
        if first is not None:
            data = await first()
            flow.last = time.monotonic()
            await dst.sendall(data)
        moved = await _direction(src, dst, None, flow)
        dst.shutdown_write()
        return moved

    pumps = [asyncio.ensure_future(one_way(a, b, opening)), asyncio.ensure_future(one_way(b, a))]
    with contextlib.suppress(TimeoutError, OSError):
        await _watch(pumps, flow, idle)


async def _watch(pumps: "Sequence[asyncio.Future[int]]", flow: _Flow, idle: float) -> None:
    """Until every direction is done; the first failure (or the idle timeout) ends the others."""
    try:
        pending = set(pumps)
        while pending:
            done, pending = await asyncio.wait(pending, timeout=min(idle, 5.0), return_when=asyncio.FIRST_EXCEPTION)
            for pump in done:
                if (exc := pump.exception()) is not None:
                    raise exc
            if pending and time.monotonic() - flow.last > idle:
                raise TimeoutError(f"no byte moved for {idle:g} s")
    finally:
        flow.stop = True
        for pump in pumps:
            pump.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)


async def _direction(src: Conn, dst: Conn, count: int | None, flow: _Flow) -> int:
    """src to dst until src ends (or `count` bytes): the first `HANDOFF` on the loop, the rest in a thread."""
    first = HANDOFF if count is None else min(HANDOFF, count)
    moved, ended = await _on_loop(src, dst, first, flow)
    while not ended and moved != count:
        rest = None if count is None else count - moved
        if _pump_threads() < MAX_THREADS:
            return moved + await _in_thread(functools.partial(_in_a_thread, src.sock, dst.sock, rest, flow), flow)
        # Every thread the process allows is moving bytes: this direction goes on on the loop,
        # slower but never stuck, and asks again after each stretch.
        step, ended = await _on_loop(src, dst, HANDOFF if rest is None else min(HANDOFF, rest), flow)
        moved += step
    return moved


# --- on the loop ------------------------------------------------------------------------------


async def _on_loop(src: Conn, dst: Conn, count: int, flow: _Flow) -> tuple[int, bool]:
    """Up to `count` bytes; (moved, whether src ended)."""
    if _SPLICE_FLAGS is not None:
        with _pipe() as (read_end, write_end):
            moved = 0
            while moved < count:
                try:
                    n = os.splice(src.sock.fileno(), write_end, count - moved, flags=_SPLICE_FLAGS)
                except BlockingIOError:
                    await _ready(src, write=False)
                    continue
                except OSError as exc:
                    if moved or exc.errno not in _UNSUPPORTED:
                        raise
                    break  # the kernel does not splice these: copy instead
                if not n:
                    return moved, True
                flow.last = time.monotonic()
                while n:
                    try:
                        sent = os.splice(read_end, dst.sock.fileno(), n, flags=_SPLICE_FLAGS)
                    except BlockingIOError:
                        await _ready(dst, write=True)
                        continue
                    n -= sent
                    moved += sent
            else:
                return moved, False
    view = memoryview(bytearray(min(count, COPY_SIZE)))
    moved = 0
    while moved < count:
        n = await src.recv_into(view[: count - moved])
        if not n:
            return moved, True
        flow.last = time.monotonic()
        await dst.sendall(view[:n])
        moved += n
    return moved, False


async def _ready(conn: Conn, *, write: bool) -> None:
    """Until the socket can be read (or written) without blocking."""
    fd = conn.sock.fileno()
    done = conn.loop.create_future()

    def wake() -> None:
        if not done.done():
            done.set_result(None)

    if write:
        conn.loop.add_writer(fd, wake)
    else:
        conn.loop.add_reader(fd, wake)
    try:
        await done
    finally:
        if write:
            conn.loop.remove_writer(fd)
        else:
            conn.loop.remove_reader(fd)


# --- in a thread ------------------------------------------------------------------------------


def _pump_threads() -> int:
    """Directions moving in threads now, in the whole process (read once per hand-off)."""
    return sum(t.name == PUMP_THREAD for t in threading.enumerate())


async def _in_thread(fn: Callable[[], int], flow: _Flow) -> int:
    """fn in a thread of its own (a tunnel may last hours: not the loop's small executor). Returns
    only once the thread has ended: a cancel asks it to stop, waits, then goes on."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[int] = loop.create_future()

    def settle(result: int, exc: BaseException | None) -> None:
        if not future.done():
            future.set_exception(exc) if exc is not None else future.set_result(result)

    def run() -> None:
        result, exc = 0, None
        try:
            result = fn()
        except BaseException as caught:  # handed to the loop, which decides
            exc = caught
        with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits any more
            loop.call_soon_threadsafe(settle, result, exc)

    threading.Thread(target=run, name=PUMP_THREAD, daemon=True).start()
    cancelled = False
    while not future.done():
        try:
            await asyncio.wait([future])
        except asyncio.CancelledError:
            cancelled = flow.stop = True
    if cancelled:
        future.exception()  # retrieved: the stop it was asked for, or what ended it first
        raise asyncio.CancelledError
    return future.result()


def _in_a_thread(src: socket.socket, dst: socket.socket, count: int | None, flow: _Flow) -> int:
    """Bytes from src to dst until src ends (or `count` have moved); how many moved."""
    moved = 0
    if _SPLICE_FLAGS is not None:
        with _pipe() as (read_end, write_end):
            while count is None or moved < count:
                want = PIPE_SIZE if count is None else min(PIPE_SIZE, count - moved)
                try:
                    n = os.splice(src.fileno(), write_end, want, flags=_SPLICE_FLAGS)
                except BlockingIOError:
                    _wait(src.fileno(), select.POLLIN, flow)
                    continue
                except OSError as exc:
                    if moved or exc.errno not in _UNSUPPORTED:
                        raise
                    break
                if not n:
                    return moved
                flow.last = time.monotonic()
                while n:
                    try:
                        sent = os.splice(read_end, dst.fileno(), n, flags=_SPLICE_FLAGS)
                    except BlockingIOError:
                        _wait(dst.fileno(), select.POLLOUT, flow)
                        continue
                    n -= sent
                    moved += sent
            else:
                return moved
    view = memoryview(bytearray(COPY_SIZE))
    while count is None or moved < count:
        want = COPY_SIZE if count is None else min(COPY_SIZE, count - moved)
        try:
            n = src.recv_into(view, want)
        except BlockingIOError:
            _wait(src.fileno(), select.POLLIN, flow)
            continue
        if not n:
            break
        flow.last = time.monotonic()
        sent = 0
        while sent < n:
            try:
                sent += dst.send(view[sent:n])
            except BlockingIOError:
                _wait(dst.fileno(), select.POLLOUT, flow)
        moved += n
    return moved


def _wait(fd: int, events: int, flow: _Flow) -> None:
    """Until fd is ready for `events` (or has failed: the next call says how); _Stopped on a stop."""
    poller = select.poll()
    poller.register(fd, events)
    while not poller.poll(_POLL_SECONDS * 1000):
        if flow.stop:
            raise _Stopped
    if flow.stop:
        raise _Stopped


@contextlib.contextmanager
def _pipe() -> Iterator[tuple[int, int]]:
    read_end, write_end = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    with contextlib.suppress(OSError):
        fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
    try:
        yield read_end, write_end
    finally:
        os.close(read_end)
        os.close(write_end)
