"""Non-blocking sockets driven by the event loop, without stream buffers: a request head is read
into bytes for h11 and nothing more (asyncio's streams copy each chunk two or three times, which
halved a download's throughput through the proxy); bodies and tunnels are pump.py's."""

import asyncio
import contextlib
import socket
from pathlib import Path

READ_SIZE = 256 * 1024
# A Unix socket's sender may queue only its send buffer (208 KiB by default) before the reader
# takes it: a download through the proxy then waits on the client at every step. 4 MiB made it as
# fast as a direct one. The kernel caps it at net.core.wmem_max (rmem_max for receiving).
UNIX_BUFFER = 4 * 1024 * 1024


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
        async with asyncio.timeout(timeout):
            return await self.loop.sock_recv(self.sock, size)

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


def widen_buffers(sock: socket.socket, size: int = UNIX_BUFFER) -> None:
    """Large send and receive buffers, as large as the kernel allows up to `size`."""
    for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, option, size)


async def open_tcp(address: str, port: int, timeout: float) -> Conn:  # noqa: ASYNC109
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setblocking(False)
    try:
        async with asyncio.timeout(timeout):
            await asyncio.get_running_loop().sock_connect(sock, (address, port))
    except BaseException:
        sock.close()
        raise
    return Conn(sock)


async def open_unix(path: Path, timeout: float) -> Conn:  # noqa: ASYNC109
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.setblocking(False)
    try:
        async with asyncio.timeout(timeout):
            await asyncio.get_running_loop().sock_connect(sock, str(path))
    except BaseException:
        sock.close()
        raise
    return Conn(sock)
