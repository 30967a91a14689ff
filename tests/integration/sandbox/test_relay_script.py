"""The sandbox relay script (what relays.py starts in every container), run here with the host's
python3 against a host Unix socket: exact bytes both ways past the pipe's size, half-closes passed
on, one connection per client, and a clear line when the socket is not there."""

import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from sandbox.relays import RELAY_SCRIPT
from tests.support.egress import send_and_read
from tests.support.waiting import until


@pytest.fixture
def channel() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="fh-rl-", dir="/tmp") as tmp:
        yield Path(tmp)


@contextlib.asynccontextmanager
async def relay(socket_path: Path) -> AsyncIterator[tuple[int, asyncio.subprocess.Process]]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-I", "-c", RELAY_SCRIPT, "0", str(socket_path),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 10)).decode().strip()
        host, _, port = line.partition(":")
        assert host == "127.0.0.1"
        yield int(port), proc
    finally:
        proc.kill()
        await proc.wait()


async def test_bytes_go_both_ways_exactly_and_half_closes_pass_on(channel: Path) -> None:
    path = channel / "echo.sock"
    connections: list[int] = []

    async def reverse_after_eof(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        data = await reader.read()  # until the client's half-close arrives
        writer.write(data[::-1])
        await writer.drain()
        writer.close()

    server = await asyncio.start_unix_server(reverse_after_eof, path=str(path), limit=1 << 20)
    data = bytes(range(256)) * (12 * 4096) + b"tail"  # 12 MiB: many pipe-fulls each way
    try:
        async with relay(path) as (port, _):
            for _ in range(2):
                answer = await send_and_read(*await asyncio.open_connection("127.0.0.1", port, limit=1 << 20), data)
                assert answer == data[::-1]
    finally:
        server.close()
        await server.wait_closed()
    assert len(connections) == 2


async def test_a_missing_socket_closes_the_client_and_says_why(channel: Path) -> None:
    async with relay(channel / "absent.sock") as (port, proc):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        assert await asyncio.wait_for(reader.read(), 10) == b""
        writer.close()
        assert proc.stderr is not None
        line = await asyncio.wait_for(proc.stderr.readline(), 10)
    assert line.startswith(b"forgehand-relay: cannot reach ") and b"absent.sock" in line


def descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def lines_into(stream: asyncio.StreamReader, out: list[bytes]) -> None:
    while line := await stream.readline():
        out.append(line)


async def test_the_relay_outlives_running_out_of_descriptors(channel: Path) -> None:
    # The relay is a sandbox's only way to the gateway and the proxy: a process in the sandbox that
    # exhausts the relay's descriptors (many connections at once) must not end it for the run.
    path = channel / "echo.sock"
    relayed = {"opened": 0}  # connections the relay made to the socket

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        relayed["opened"] += 1
        writer.write(await reader.read())
        await writer.drain()
        writer.close()

    server = await asyncio.start_unix_server(echo, path=str(path))
    limit = (48, 48)  # a few dozen descriptors: each connection takes a socket each side and two pipes
    proc = await asyncio.create_subprocess_exec(
        "prlimit", f"--nofile={limit[0]}:{limit[1]}", sys.executable, "-I", "-c", RELAY_SCRIPT, "0", str(path),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    said: list[bytes] = []
    listening = asyncio.ensure_future(lines_into(proc.stderr, said))
    held: list[asyncio.StreamWriter] = []
    try:
        port = int((await asyncio.wait_for(proc.stdout.readline(), 10)).decode().strip().partition(":")[2])
        idle = descriptors(proc.pid)
        for _ in range(40):  # more than the relay can hold open
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            held.append(writer)
        await until(lambda: said, timeout=30, what="the relay to run out of descriptors (a line on stderr)")
        for writer in held:
            writer.close()
        held.clear()

        def settled() -> bool:
            """Each of the 40 was relayed or refused ("cannot reach") and the relay holds no
            connection any more (its descriptors are back to what it held idle), or it is gone."""
            if listening.done():  # its stderr ended
                return True
            refused = sum(line.startswith(b"forgehand-relay: cannot reach") for line in said)
            return relayed["opened"] + refused == 40 and descriptors(proc.pid) == idle

        await until(settled, timeout=30, what="the relay to deal with every connection")
        assert proc.returncode is None  # still running
        answer = await send_and_read(*await asyncio.open_connection("127.0.0.1", port), b"still here")
        assert answer == b"still here"
    finally:
        for writer in held:
            writer.close()
        if proc.returncode is None:
            proc.kill()
        await proc.wait()
        await listening
        server.close()
        await server.wait_closed()
