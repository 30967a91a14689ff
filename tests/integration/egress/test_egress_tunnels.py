"""CONNECT tunnels and large bodies through the egress proxy, against real local servers: the SNI
check on a tunnel's TLS ClientHello (real TLS clients, and hellos no real client sends), and bytes
that move socket to socket once checked (exact, re-checked per request, ended by the timeouts)."""

import asyncio
import contextlib
import socket
import ssl
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import trustme

from egress import Timeouts
from egress.pump import HANDOFF
from tests.support.egress import origin_server, running_proxy, send_and_read, status_of
from tests.support.tls_hello import as_records, built_hello, extension, real_client_hello, server_name_extension
from tests.support.waiting import until


@pytest.fixture
def sock() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="fh-eg-", dir="/tmp") as tmp:
        yield Path(tmp) / "egress.sock"


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


async def to_127(host: str, port: int) -> list[str]:
    return ["127.0.0.1"]  # every test name is this machine (exempted with allowed_hosts)


def tls_server(ca: trustme.CA) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("allowed.test", "other.test").configure_cert(context)
    return context


async def open_tunnel(sock: Path, target: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_unix_connection(str(sock), limit=1 << 20)
    writer.write(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 "), head
    return reader, writer


async def https_get(
    sock: Path, ca: trustme.CA, target: str, server_hostname: str | None, path: str = "/secure"
) -> bytes:
    reader, writer = await open_tunnel(sock, target)
    context = ssl.create_default_context()
    ca.configure_trust(context)
    if server_hostname is None:  # no SNI: nothing to check the certificate's name against either
        context.check_hostname = False
    try:
        await asyncio.wait_for(writer.start_tls(context, server_hostname=server_hostname), 10)
        writer.write(f"GET {path} HTTP/1.1\r\nHost: {target}\r\nConnection: close\r\n\r\n".encode())
        return await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()


async def test_a_tls_hello_naming_the_connect_host_passes(sock: Path, ca: trustme.CA) -> None:
    with origin_server({"/secure": b"over tls"}, tls=tls_server(ca)) as origin:
        target = f"allowed.test:{origin.port}"
        async with running_proxy(sock, [target], allowed_hosts="127.0.0.1", resolver=to_127) as rec:
            named = await https_get(sock, ca, target, "allowed.test")
            unnamed = await https_get(sock, ca, target, None)  # a hello without SNI: allowed
    assert named.startswith(b"HTTP/1.1 200") and named.endswith(b"over tls")
    assert unnamed.startswith(b"HTTP/1.1 200") and unnamed.endswith(b"over tls")
    assert [(a.host, a.method) for a in rec.allowed] == [("allowed.test", "CONNECT")] * 2 and rec.blocked == []


async def test_a_tls_hello_naming_another_host_is_refused(sock: Path, ca: trustme.CA) -> None:
    """Domain fronting: the tunnel is to an allowed host, the hello asks the front end for another."""
    with origin_server({"/secure": b"over tls"}, tls=tls_server(ca)) as origin:
        target = f"allowed.test:{origin.port}"
        async with running_proxy(sock, [target], allowed_hosts="127.0.0.1", resolver=to_127) as rec:
            with pytest.raises((ssl.SSLError, ConnectionError, asyncio.IncompleteReadError)):
                await https_get(sock, ca, target, "other.test")
    assert origin.requests == []
    [blocked] = rec.blocked
    assert (blocked.host, blocked.port, blocked.method, blocked.rules) == (
        "allowed.test",
        origin.port,
        "CONNECT",
        "allow-list",
    )
    assert "'other.test' (SNI)" in blocked.reason and "allowed.test" in blocked.reason
    assert rec.allowed == [] and rec.proxy.stats.allowed == 0


async def test_the_sni_check_ignores_case_and_a_trailing_dot_and_reads_split_hellos(sock: Path) -> None:
    """The hello arrives in pieces (three writes, a pause between): the proxy waits for all of it;
    the names are compared as hosts are (case-insensitive, without a trailing dot)."""
    received: list[bytes] = []
    with raw_server(lambda conn: received.append(conn.recv(65536))) as port:
        async with running_proxy(sock, [f"allowed.test:{port}"], allowed_hosts="127.0.0.1", resolver=to_127) as rec:
            hello = as_records(built_hello(server_name_extension(b"Allowed.TEST.")), 60)
            reader, writer = await open_tunnel(sock, f"allowed.test:{port}")
            for part in (hello[:3], hello[3:70], hello[70:]):
                writer.write(part)
                await writer.drain()
                # The pause is the scenario (the proxy reads the hello in pieces); no event tells
                # this test that the proxy has read a piece.
                await asyncio.sleep(0.05)
            writer.write_eof()
            assert await asyncio.wait_for(reader.read(), 10) == b""
            writer.close()
    assert received == [hello] and rec.blocked == [] and rec.proxy.stats.allowed == 1


def ech_hello() -> bytes:
    return as_records(built_hello(server_name_extension(b"allowed.test"), extension(0xFE0D, b"\x00" * 40)), 1000)


@pytest.mark.parametrize(
    ("opening", "why"),
    [
        (b"\x16\x03\x01\x00\x05\x02\x00\x00\x01\x00", "not a ClientHello"),
        (real_client_hello("allowed.test")[:100], "closed in the middle of its ClientHello"),  # then EOF
        (as_records(built_hello(extension(21, b"\x00" * 20000)), 16384), "longer than 16384 bytes"),
        (as_records(built_hello(server_name_extension(b"allowed.test", b"other.test")), 500), "2 host names"),
        (ech_hello(), "encrypted_client_hello"),
    ],
    ids=["not-a-hello", "truncated", "oversize", "two-names", "ech"],
)
async def test_malformed_truncated_oversize_or_hidden_hellos_are_refused(sock: Path, opening: bytes, why: str) -> None:
    received: list[bytes] = []
    with raw_server(lambda conn: received.append(conn.recv(65536))) as port:
        async with running_proxy(sock, [f"allowed.test:{port}"], allowed_hosts="127.0.0.1", resolver=to_127) as rec:
            reader, writer = await open_tunnel(sock, f"allowed.test:{port}")
            writer.write(opening)
            with contextlib.suppress(ConnectionError):
                await writer.drain()
                writer.write_eof()
            try:
                answer = await asyncio.wait_for(reader.read(), 10)
            except ConnectionResetError:  # closed with the rest of an oversize hello unread
                answer = b""
            writer.close()
    assert answer == b""  # closed, and nothing came back
    [blocked] = rec.blocked
    assert blocked.rules == "request" and blocked.method == "CONNECT" and why in blocked.reason
    assert received in ([], [b""]) and rec.proxy.stats.allowed == 0


async def test_a_tunnel_carries_tls_only_though_a_server_may_speak_first(sock: Path) -> None:
    received: list[bytes] = []

    def banner_then_echo(conn: socket.socket) -> None:
        conn.sendall(b"SSH-2.0-test\r\n")
        received.append(conn.recv(100))

    with raw_server(banner_then_echo) as port:
        async with running_proxy(sock, [f"allowed.test:{port}"], allowed_hosts="127.0.0.1", resolver=to_127) as rec:
            reader, writer = await open_tunnel(sock, f"allowed.test:{port}")
            # The banner arrives while the proxy still holds back the client's (not yet sent) bytes...
            assert await asyncio.wait_for(reader.readuntil(b"\r\n"), 10) == b"SSH-2.0-test\r\n"
            # ... but what the client sends must be TLS: anything else closes the tunnel, unsent.
            writer.write(b"SSH-2.0-client")
            assert await asyncio.wait_for(reader.read(), 10) == b""
            writer.close()
    assert received in ([], [b""])
    [blocked] = rec.blocked
    assert (blocked.method, blocked.rules) == ("CONNECT", "request") and "TLS only" in blocked.reason
    assert rec.proxy.stats.allowed == 0


async def test_plain_http_in_a_tunnel_cannot_name_another_host(sock: Path) -> None:
    # A CDN routes plain HTTP by its Host header: a tunnel to an allowed name on port 80 must not
    # carry a request for another site on the same front end (the forward path refuses it too).
    seen: list[bytes] = []

    def front_end(conn: socket.socket) -> None:
        seen.append(conn.recv(1000))
        conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")

    with raw_server(front_end) as port:
        async with running_proxy(sock, [f"allowed.test:{port}"], allowed_hosts="127.0.0.1", resolver=to_127) as rec:
            reader, writer = await open_tunnel(sock, f"allowed.test:{port}")
            writer.write(b"GET / HTTP/1.1\r\nHost: evil.example\r\n\r\n")
            assert await asyncio.wait_for(reader.read(), 10) == b""
            writer.close()
    assert seen in ([], [b""])  # the front end never saw the request
    [blocked] = rec.blocked
    assert blocked.host == "allowed.test" and "TLS only" in blocked.reason


# --- bytes that move socket to socket -------------------------------------------------------------


@contextlib.contextmanager
def raw_server(handle: Callable[[socket.socket], object]) -> Iterator[int]:
    """A TCP server on 127.0.0.1 calling `handle` with each connection (closed after)."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.1)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            conn.settimeout(10)
            threading.Thread(target=lambda c=conn: _handled(handle, c), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        thread.join(5)
        listener.close()


def _handled(handle: Callable[[socket.socket], object], conn: socket.socket) -> None:
    with conn, contextlib.suppress(OSError):
        handle(conn)


def echo(conn: socket.socket) -> None:
    while chunk := conn.recv(1 << 20):
        conn.sendall(chunk)


def tunnel_bytes(size: int) -> bytes:
    """What a client sends through a tunnel: a TLS ClientHello first (a tunnel carries TLS; no
    name, the host is an address), then `size` bytes."""
    return real_client_hello(None) + bytes(range(256)) * (size // 256) + b"x" * (size % 256)


async def test_a_large_tunnel_arrives_exactly_both_ways(sock: Path) -> None:
    data = tunnel_bytes(8 * HANDOFF + 12345)  # well past the bytes a direction moves on the loop

    with raw_server(echo) as port:
        async with running_proxy(sock, [f"127.0.0.1:{port}"], allowed_hosts="127.0.0.1"):
            echoed = await send_and_read(*await open_tunnel(sock, f"127.0.0.1:{port}"), data)
    assert echoed == data


async def test_after_a_large_body_the_next_request_is_checked_again(sock: Path) -> None:
    big = bytes(range(256)) * (16 * 1024 * 4)  # 16 MiB: moved socket to socket, in a thread
    with origin_server({"/pub/big": big, "/private": b"no"}) as origin:
        base, host = f"http://127.0.0.1:{origin.port}", f"127.0.0.1:{origin.port}"
        async with running_proxy(sock, [f"GET {base}/pub/"], allowed_hosts="127.0.0.1") as rec:
            reader, writer = await asyncio.open_unix_connection(str(sock), limit=1 << 20)
            for path in ("/pub/big", "/pub/big", "/private"):
                writer.write(f"GET {base}{path} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
            answers = []
            for _ in range(3):
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
                length = int(
                    next(h for h in head.lower().split(b"\r\n") if h.startswith(b"content-length")).split(b":")[1]
                )
                answers.append((status_of(head), await asyncio.wait_for(reader.readexactly(length), 30)))
            writer.close()
    assert [status for status, _ in answers] == [200, 200, 403]
    assert answers[0][1] == big and answers[1][1] == big
    assert [p for _, p, _ in origin.requests] == ["/pub/big", "/pub/big"]
    assert rec.proxy.stats.allowed == 2 and [b.rules for b in rec.blocked] == ["allow-list"]


async def test_a_body_that_stalls_past_the_handoff_ends_at_the_idle_timeout(sock: Path) -> None:
    def stall(conn: socket.socket) -> None:
        conn.recv(65536)
        conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 8388608\r\n\r\n" + b"x" * (2 * HANDOFF))
        threading.Event().wait(10)  # and then nothing

    with raw_server(stall) as port:
        async with running_proxy(sock, [f"127.0.0.1:{port}"], allowed_hosts="127.0.0.1", timeouts=Timeouts(idle=0.5)):
            reader, writer = await asyncio.open_unix_connection(str(sock))
            writer.write(f"GET http://127.0.0.1:{port}/ HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
            started = asyncio.get_running_loop().time()
            got = await asyncio.wait_for(reader.read(), 10)  # until the proxy hangs up
            elapsed = asyncio.get_running_loop().time() - started
            writer.close()
    assert got.endswith(b"x" * (2 * HANDOFF)) and elapsed < 5


async def test_closing_the_proxy_ends_a_tunnel_moving_bytes_in_a_thread(sock: Path) -> None:
    def flood(conn: socket.socket) -> None:
        chunk = b"y" * (1 << 20)
        while True:
            conn.sendall(chunk)

    with raw_server(flood) as port:
        async with running_proxy(sock, [f"127.0.0.1:{port}"], allowed_hosts="127.0.0.1") as rec:
            reader, writer = await open_tunnel(sock, f"127.0.0.1:{port}")
            writer.write(real_client_hello(None))
            read = 0
            while read < 4 * HANDOFF:  # the download has moved to its thread
                got = await asyncio.wait_for(reader.read(1 << 20), 10)
                assert got, "the tunnel closed before the download moved to its thread"
                read += len(got)
            started = asyncio.get_running_loop().time()
            await rec.proxy.close()
            elapsed = asyncio.get_running_loop().time() - started
            with contextlib.suppress(ConnectionError):
                while await asyncio.wait_for(reader.read(1 << 20), 10):
                    pass
            writer.close()
            # A pump thread has settled its future just before it exits.
            await until(
                lambda: not any(t.name == "egress-pump" for t in threading.enumerate()),
                timeout=10,
                what="the egress pump threads to exit",
            )
    assert elapsed < 2 and [t.name for t in threading.enumerate() if t.name == "egress-pump"] == []


async def test_past_the_process_s_pump_threads_a_tunnel_goes_on_on_the_loop(
    sock: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("egress.pump.MAX_THREADS", 0)  # every thread slot taken
    data = tunnel_bytes(6 * HANDOFF + 777)

    with raw_server(echo) as port:
        async with running_proxy(sock, [f"127.0.0.1:{port}"], allowed_hosts="127.0.0.1"):
            echoed = await send_and_read(*await open_tunnel(sock, f"127.0.0.1:{port}"), data)
            threads = [t.name for t in threading.enumerate() if t.name == "egress-pump"]
    assert echoed == data and threads == []
