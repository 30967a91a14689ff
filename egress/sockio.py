"""Non-blocking sockets driven by the event loop, without stream buffers: bytes go from the kernel
into one reusable buffer per direction and back out (asyncio's streams copy each chunk two or three
times, which halved a download's throughput through the proxy); a tunnel's bytes go through a
kernel pipe and never reach the process at all."""

import asyncio
import contextlib
import errno
import fcntl
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path

READ_SIZE = 256 * 1024
PIPE_SIZE = 1024 * 1024  # the kernel pipe of a spliced direction (the default is 64 KiB)


class Conn:
    """One connection (TCP or Unix). `recv` and `sendall` wait on the loop; nothing is buffered."""

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self.sock = sock
        self.loop = asyncio.get_running_loop()
        self.closed = False

    async def recv(self, timeout: float | None = None, size: int = READ_SIZE) -> bytes:  # noqa: ASYNC109
        """Up to `size` bytes (b"" at the end); TimeoutError after `timeout` seconds without any."""
        if timeout is None:
            return await self.loop.sock_recv(self.sock, size)
        return await asyncio.wait_for(self.loop.sock_recv(self.sock, size), timeout)

    async def recv_into(self, view: memoryview) -> int:
        return await self.loop.sock_recv_into(self.sock, view)

    async def sendall(self, data: bytes | bytearray | memoryview) -> None:
        if data:
            await self.loop.sock_sendall(self.sock, data)

    def shutdown_write(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.sock.close()


async def open_tcp(address: str, port: int, timeout: float) -> Conn:  # noqa: ASYNC109
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setblocking(False)
    try:
        await asyncio.wait_for(asyncio.get_running_loop().sock_connect(sock, (address, port)), timeout)
    except BaseException:
        sock.close()
        raise
    return Conn(sock)


async def open_unix(path: Path, timeout: float) -> Conn:  # noqa: ASYNC109
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.setblocking(False)
    try:
        await asyncio.wait_for(asyncio.get_running_loop().sock_connect(sock, str(path)), timeout)
    except BaseException:
        sock.close()
        raise
    return Conn(sock)


async def splice(a: Conn, b: Conn, idle: float) -> None:
    """Bytes both ways until both sides are done, half-closes passed on; ends when no byte moved
    in either direction for `idle` seconds (one direction may be quiet for a whole download), or
    when either side fails. On Linux the bytes go through a kernel pipe (splice(2)) and never
    reach this process; elsewhere, or if the kernel refuses, through one buffer per direction."""
    last = time.monotonic()

    def moved() -> None:
        nonlocal last
        last = time.monotonic()

    pumps = [asyncio.ensure_future(_pump(a, b, moved)), asyncio.ensure_future(_pump(b, a, moved))]
    try:
        pending = set(pumps)
        while pending:
            done, pending = await asyncio.wait(pending, timeout=min(idle, 5.0), return_when=asyncio.FIRST_EXCEPTION)
            if any(t.exception() is not None for t in done if not t.cancelled()):
                return  # a reset on one side ends both
            if time.monotonic() - last > idle:
                return
    finally:
        for task in pumps:
            task.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)


async def _pump(src: Conn, dst: Conn, moved: Callable[[], None]) -> None:
    if _SPLICE_FLAGS is not None:
        try:
            await _kernel_pump(src, dst, moved)
            dst.shutdown_write()
            return
        except _Unsupported:
            pass  # nothing was moved yet: copy instead
    view = memoryview(bytearray(READ_SIZE))
    while n := await src.recv_into(view):
        moved()
        await dst.sendall(view[:n])
    dst.shutdown_write()


class _Unsupported(Exception):
    """The kernel does not splice between these two sockets."""


_SPLICE_FLAGS = (os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK) if hasattr(os, "splice") else None


async def _kernel_pump(src: Conn, dst: Conn, moved: Callable[[], None]) -> None:
    assert _SPLICE_FLAGS is not None
    read_end, write_end = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    with contextlib.suppress(OSError):
        fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
    first = True
    try:
        while True:
            try:
                n = os.splice(src.sock.fileno(), write_end, PIPE_SIZE, flags=_SPLICE_FLAGS)
            except BlockingIOError:
                await _ready(src, write=False)
                continue
            except OSError as exc:
                if first and exc.errno in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                    raise _Unsupported from exc
                raise
            first = False
            if not n:
                return  # the end of this direction
            moved()
            while n:
                try:
                    n -= os.splice(read_end, dst.sock.fileno(), n, flags=_SPLICE_FLAGS)
                except BlockingIOError:
                    await _ready(dst, write=True)
    finally:
        os.close(read_end)
        os.close(write_end)


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
