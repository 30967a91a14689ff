"""The exec output pump on a local socket pair: Docker's frame format, the pid marker, the output
cap and backpressure, without an engine; and `read_stdout` (Sandbox.run_quiet's read), which must
keep what http.client buffered past the upgrade response's headers."""

import asyncio
import http.client
import socket
import struct
from types import SimpleNamespace
from typing import Any

from sandbox.pump import PID_MARKER, Channel, End, OutputChunk, Pump, read_stdout
from tests.support.waiting import until


def frame(stream: int, data: bytes) -> bytes:
    return struct.pack(">BxxxL", stream, len(data)) + data


async def collect(pump: Pump, channel: Channel) -> list[OutputChunk]:
    out: list[OutputChunk] = []
    while True:
        item = await channel.get()
        if isinstance(item, End):
            assert item.error is None
            return out
        out.append(item)


async def run_pump(payload: bytes, *, cap: int = 1 << 20, split: int = 3) -> tuple[Pump, list[OutputChunk]]:
    a, b = socket.socketpair()
    channel = Channel(asyncio.get_running_loop(), 4)
    pump = Pump(b, channel, cap)
    pump.thread.start()
    # Dribble the bytes in tiny writes so headers and payloads arrive split at every offset.
    for i in range(0, len(payload), split):
        a.sendall(payload[i : i + split])
    a.close()
    chunks = await collect(pump, channel)
    pump.thread.join(5)
    b.close()
    return pump, chunks


def joined(chunks: list[OutputChunk], stream: str) -> bytes:
    return b"".join(c.data for c in chunks if c.stream == stream)


async def test_frames_are_demultiplexed_and_the_marker_removed() -> None:
    payload = frame(2, PID_MARKER + b"4242\nwarn") + frame(1, b"hello ") + frame(1, b"world\n") + frame(2, b" more\n")
    pump, chunks = await run_pump(payload)
    assert pump.pid == 4242
    assert joined(chunks, "stdout") == b"hello world\n"
    assert joined(chunks, "stderr") == b"warn more\n"
    assert pump.truncated == 0


async def test_marker_split_across_frames() -> None:
    payload = frame(2, PID_MARKER[:5]) + frame(2, PID_MARKER[5:] + b"7") + frame(2, b"\nerr")
    pump, chunks = await run_pump(payload, split=1)
    assert pump.pid == 7
    assert joined(chunks, "stderr") == b"err"


async def test_without_marker_everything_is_output() -> None:
    pump, chunks = await run_pump(frame(2, b"plain stderr") + frame(1, b"out"))
    assert pump.pid is None
    assert joined(chunks, "stderr") == b"plain stderr"


async def test_cap_counts_the_rest_as_truncated() -> None:
    payload = frame(1, b"a" * 600) + frame(2, b"b" * 600) + frame(1, b"c" * 600)
    pump, chunks = await run_pump(payload, cap=1000, split=97)
    assert sum(len(c.data) for c in chunks) == 1000
    assert joined(chunks, "stdout") == b"a" * 600
    assert joined(chunks, "stderr") == b"b" * 400
    assert pump.truncated == 800


class WatchedChannel(Channel):
    """A channel that counts the pump's puts begun and done: one begun and not done is the pump
    waiting for room."""

    def __init__(self, loop: asyncio.AbstractEventLoop, max_items: int) -> None:
        super().__init__(loop, max_items)
        self.begun = 0
        self.done = 0

    def put(self, item: OutputChunk) -> bool:
        self.begun += 1
        try:
            return super().put(item)
        finally:
            self.done += 1


async def test_slow_consumer_slows_the_producer() -> None:
    # The channel holds 4 chunks; a consumer that reads nothing must stop the pump from reading,
    # so the sender's socket buffer fills up and its writes block (nothing is dropped).
    a, b = socket.socketpair()
    b.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    channel = WatchedChannel(asyncio.get_running_loop(), 4)
    pump = Pump(b, channel, 1 << 30)
    pump.thread.start()
    a.setblocking(False)
    sent = 0
    block = frame(1, b"x" * 1000)

    def held() -> bool:  # four chunks queued, the fifth waiting for room: the pump reads no more
        return channel.done == 4 and channel.begun == 5

    def sender_held() -> bool:
        """Send what the socket takes; True once it takes no more while the pump waits for room
        (or once everything went: nothing held the sender back, which the assertion catches)."""
        nonlocal sent
        try:
            while sent < 200 * len(block):
                sent += a.send(block)
        except BlockingIOError:
            return held()
        return True

    await until(sender_held, timeout=30, what="the sender to be held back by the full channel")
    assert sent < 100 * len(block), "the producer should have been held back"
    # Now drain everything that was sent: all of it arrives.
    a.setblocking(True)
    a.shutdown(socket.SHUT_WR)
    received = 0
    while True:
        item = await channel.get()
        if isinstance(item, End):
            break
        received += len(item.data)
    assert received == (sent // len(block)) * 1000 + max(0, sent % len(block) - 8)
    a.close()
    b.close()


UPGRADED = (
    b"HTTP/1.1 101 UPGRADED\r\nContent-Type: application/vnd.docker.raw-stream\r\n"
    b"Connection: Upgrade\r\nUpgrade: tcp\r\n\r\n"
)


def upgraded(engine_wrote: bytes) -> tuple[socket.socket, Any]:
    """The engine's end, and what `exec_start(socket=True)` returns once http.client read the 101
    response, when the engine had written `engine_wrote` (headers and whatever followed) by then."""
    a, b = socket.socketpair()
    a.sendall(engine_wrote)
    response = http.client.HTTPResponse(b)
    response.begin()  # reads the headers through a buffer, which takes what followed them too
    sock: Any = response.fp.raw  # docker-py's raw socket: a SocketIO below that buffer
    sock._response = SimpleNamespace(raw=SimpleNamespace(_fp=response))  # docker-py keeps the response there
    return a, sock


def response_buffered(sock: Any) -> bool:
    raw = sock._sock
    raw.setblocking(False)
    try:
        return bool(sock._response.raw._fp.fp.peek(1))
    finally:
        raw.setblocking(True)


def test_read_stdout_keeps_the_output_that_came_with_the_headers() -> None:
    # A short command's whole output, written before this side read the response: all in the buffer.
    a, sock = upgraded(UPGRADED + frame(1, b"7:2\n"))
    a.close()
    assert response_buffered(sock)
    assert read_stdout(sock, 4096) == b"7:2\n"
    sock.close()


def test_read_stdout_joins_the_buffered_start_to_the_rest_of_the_stream() -> None:
    a, sock = upgraded(UPGRADED + frame(1, b"first ") + frame(2, b"err")[:5])
    a.sendall(frame(2, b"err")[5:] + frame(1, b"second\n") + frame(1, b"x" * 5000))
    a.close()
    assert read_stdout(sock, 20) == b"first second\nxxxxxxx"  # stdout only, its first 20 bytes
    sock.close()
