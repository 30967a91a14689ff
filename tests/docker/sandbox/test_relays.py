"""Relays on the real engine: a process in the container reaches a host Unix socket through
127.0.0.1:<port>; without a relay nothing listens; a relay that cannot start fails the start."""

import asyncio
import contextlib
import io
import secrets
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import docker
import docker.errors
import pytest

from sandbox import (
    EGRESS_PROXY_PORT,
    GATEWAY_RELAY_PORT,
    Relay,
    RelayFailed,
    SandboxEngine,
    list_sandboxes,
)
from sandbox.relays import start_relays
from tests.docker.conftest import INSTANCE, SpecFactory
from tests.support.waiting import until

# Connects to 127.0.0.1:PORT, sends MESSAGE (stdin for "-"), half-closes and prints what comes back (or the error).
_CLIENT = """\
import socket, sys
try:
    s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=5)
except OSError as exc:
    print("refused:", type(exc).__name__)
    sys.exit(7)
data = b""
try:
    s.sendall(sys.stdin.buffer.read() if sys.argv[2] == "-" else sys.argv[2].encode())
    s.shutdown(socket.SHUT_WR)
    while chunk := s.recv(65536):
        data += chunk
except OSError:
    print("closed", data.decode())
    sys.exit(8)
print(data.decode())
"""

# Prints "UID PID/SID PORT" for each relay process (the image has no ps).
_RELAYS = """\
import os
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        argv = open("/proc/%s/cmdline" % pid, "rb").read().split(b"\\0")
        status = open("/proc/%s/status" % pid).read()
        stat = open("/proc/%s/stat" % pid).read()
    except OSError:
        continue
    if len(argv) > 4 and argv[1:3] == [b"-I", b"-c"] and b"forgehand-relay" in argv[3][:80]:
        uid = [line.split()[1] for line in status.splitlines() if line.startswith("Uid:")][0]
        sid = stat.rsplit(")", 1)[1].split()[3]
        print(uid, "%s/%s" % (pid, sid), argv[4].decode())
"""


@contextlib.asynccontextmanager
async def unix_echo(path: Path, tag: str) -> AsyncIterator[list[bytes]]:
    """A host Unix socket server answering TAG + what it received (after the client's half-close)."""
    seen: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        data = await reader.read()
        seen.append(data)
        writer.write(tag.encode() + data)
        await writer.drain()
        writer.close()

    server = await asyncio.start_unix_server(handle, path=str(path))
    path.chmod(0o666)  # the sandbox user is not the test's
    try:
        yield seen
    finally:
        server.close()
        await server.wait_closed()


async def test_relays_reach_host_sockets(engine: SandboxEngine, make_spec: SpecFactory, channel_dir: Path) -> None:
    async with (
        unix_echo(channel_dir / "gateway.sock", "gw:") as gw_seen,
        unix_echo(channel_dir / "egress.sock", "eg:") as eg_seen,
    ):
        spec = make_spec(
            channel_dir=channel_dir,
            relays=(Relay(GATEWAY_RELAY_PORT, "gateway.sock"), Relay(EGRESS_PROXY_PORT, "egress.sock")),
        )
        async with await engine.start(spec) as sb:
            # The first exec after start finds both listening: no wait, no retry.
            r = await sb.exec(["python3", "-c", _CLIENT, str(GATEWAY_RELAY_PORT), "hello"])
            assert r.exit_code == 0, r.stdout + r.stderr
            assert r.stdout == b"gw:hello\n"
            big = secrets.token_hex(200_000)  # 400 kB each way: more than one read
            r = await sb.exec(
                ["python3", "-c", _CLIENT, str(EGRESS_PROXY_PORT), "-"], stdin=big.encode(), output_cap=1 << 20
            )
            assert r.stdout == f"eg:{big}\n".encode()
            assert gw_seen == [b"hello"] and eg_seen == [big.encode()]
            # The relays run as the sandbox user, in sessions of their own, and outlive commands
            # (the exec wrapper reaps only what a command leaves behind).
            r = await sb.exec(["python3", "-c", _RELAYS])
            relays = sorted(tuple(line.split()) for line in r.stdout.decode().splitlines())
            assert sorted((uid, port) for uid, _, port in relays) == [
                ("1000", str(EGRESS_PROXY_PORT)),
                ("1000", str(GATEWAY_RELAY_PORT)),
            ]
            assert all(sid == pid for pid, sid in [row[1].split("/") for row in relays])
            r = await sb.exec(["python3", "-c", _CLIENT, str(GATEWAY_RELAY_PORT), "again"])
            assert r.stdout == b"gw:again\n"
            # Only loopback: the relay is not on any other address of the container.
            r = await sb.exec(["sh", "-c", "cat /proc/net/tcp /proc/net/tcp6"])
            listening = [line.split()[1] for line in r.stdout.decode().splitlines()[1:] if " 0A " in line]
            assert sorted(listening) == sorted(
                [f"0100007F:{GATEWAY_RELAY_PORT:04X}", f"0100007F:{EGRESS_PROXY_PORT:04X}"]
            )


async def test_without_relays_nothing_listens(engine: SandboxEngine, make_spec: SpecFactory, channel_dir: Path) -> None:
    async with unix_echo(channel_dir / "gateway.sock", "gw:") as seen:
        async with await engine.start(make_spec(channel_dir=channel_dir)) as sb:
            for port in (GATEWAY_RELAY_PORT, EGRESS_PROXY_PORT):
                r = await sb.exec(["python3", "-c", _CLIENT, str(port), "x"])
                assert r.exit_code == 7 and r.stdout == b"refused: ConnectionRefusedError\n"
        assert seen == []


async def test_relay_to_a_missing_socket_closes_the_connection(
    engine: SandboxEngine, make_spec: SpecFactory, channel_dir: Path
) -> None:
    spec = make_spec(channel_dir=channel_dir, relays=(Relay(GATEWAY_RELAY_PORT, "gateway.sock"),))
    async with await engine.start(spec) as sb:
        r = await sb.exec(["python3", "-c", _CLIENT, str(GATEWAY_RELAY_PORT), "x"])
        # Accepted, then closed with nothing sent (before or after the client's half-close).
        assert (r.exit_code, r.stdout) in [(0, b"\n"), (8, b"closed \n")]


async def test_a_relay_that_cannot_start_is_a_clear_error(
    engine: SandboxEngine, make_spec: SpecFactory, channel_dir: Path
) -> None:
    spec = make_spec(channel_dir=channel_dir, relays=(Relay(GATEWAY_RELAY_PORT, "gateway.sock"),))
    async with await engine.start(spec) as sb:
        with pytest.raises(RelayFailed, match=f"port.*{GATEWAY_RELAY_PORT} already in use"):
            await start_relays(sb)


@pytest.fixture
def image_without_python(docker_client: docker.DockerClient, sandbox_image: str) -> Iterator[str]:
    tag = f"forgehand-test-nopython:{secrets.token_hex(4)}"
    recipe = f"FROM {sandbox_image}\nUSER 0\nRUN rm -f /usr/bin/python3*\nUSER 1000:1000\n"
    docker_client.images.build(fileobj=io.BytesIO(recipe.encode()), tag=tag, network_mode="none", rm=True)
    yield tag
    with contextlib.suppress(docker.errors.APIError):
        docker_client.images.remove(tag, force=True)


async def test_start_fails_and_leaves_nothing_when_a_relay_cannot_start(
    engine: SandboxEngine, make_spec: SpecFactory, channel_dir: Path, image_without_python: str
) -> None:
    spec = make_spec(
        image=image_without_python, channel_dir=channel_dir, relays=(Relay(EGRESS_PROXY_PORT, "egress.sock"),)
    )
    with pytest.raises(RelayFailed, match="has no python3"):
        await engine.start(spec)

    async def gone() -> bool:  # removed in the background
        return not [s for s in await list_sandboxes(engine, INSTANCE) if s.run == spec.run]

    await until(gone, timeout=30, what="the sandbox to be removed")
    assert [s for s in await list_sandboxes(engine, INSTANCE) if s.run == spec.run] == []


async def test_relays_in_the_agents_image(
    engine: SandboxEngine, make_spec: SpecFactory, channel_dir: Path, agents_image: str
) -> None:
    """The agents image runs the same relay (its forgehand-relay is that script, started the same way)."""
    async with unix_echo(channel_dir / "gateway.sock", "gw:"):
        spec = make_spec(
            image=agents_image, channel_dir=channel_dir, relays=(Relay(GATEWAY_RELAY_PORT, "gateway.sock"),)
        )
        async with await engine.start(spec) as sb:
            r = await sb.exec(["python3", "-c", _CLIENT, str(GATEWAY_RELAY_PORT), "agents"])
            assert r.stdout == b"gw:agents\n"
