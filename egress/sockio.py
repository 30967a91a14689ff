"""Non-blocking sockets driven by the event loop, without stream buffers: bytes go from the kernel
into one reusable buffer per direction and back out (asyncio's streams copy each chunk two or three
times, which halved a download's throughput through the proxy)."""

import asyncio
import contextlib
import socket
import time
from pathlib import Path

READ_SIZE = 256 * 1024


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
    when either side fails."""
    last = time.monotonic()

    async def pump(src: Conn, dst: Conn) -> None:
        nonlocal last
        view = memoryview(bytearray(READ_SIZE))
        while n := await src.recv_into(view):
            last = time.monotonic()
            await dst.sendall(view[:n])
        dst.shutdown_write()

    pumps = [asyncio.ensure_future(pump(a, b)), asyncio.ensure_future(pump(b, a))]
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
