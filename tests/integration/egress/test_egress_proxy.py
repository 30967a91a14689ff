"""The egress proxy on the host, against real local servers over its real Unix socket: what it
forwards, what it refuses (and reports), and how it ends what it must not keep."""

import asyncio
import ssl
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from egress import Timeouts
from tests.support.egress import origin_server, raw_exchange, running_proxy, status_of, throwaway_ca
from tests.support.waiting import until


@pytest.fixture
def sock() -> Iterator[Path]:
    # Short, under /tmp: a Unix socket path must stay under 108 bytes.
    with tempfile.TemporaryDirectory(prefix="fh-eg-", dir="/tmp") as tmp:
        yield Path(tmp) / "egress.sock"


def get(url: str, host: str, extra: str = "") -> bytes:
    return f"GET {url} HTTP/1.1\r\nHost: {host}\r\n{extra}Connection: close\r\n\r\n".encode()


async def test_plain_http_is_forwarded_in_origin_form(sock: Path) -> None:
    with origin_server({"/file": b"payload"}) as origin:
        rule, url, host = f"127.0.0.1:{origin.port}", f"http://127.0.0.1:{origin.port}/file", f"127.0.0.1:{origin.port}"
        async with running_proxy(sock, [rule], allowed_hosts="127.0.0.1") as rec:
            answer = await raw_exchange(sock, get(url, host, "Proxy-Authorization: Basic eDp5\r\nX-Kept: 1\r\n"))
    assert status_of(answer) == 200 and answer.endswith(b"\r\n\r\npayload")
    [(method, path, headers)] = origin.requests
    assert (method, path) == ("GET", "/file")
    assert headers["host"] == host and headers["x-kept"] == "1"
    assert "proxy-authorization" not in headers  # the proxy's own headers stop here
    assert [(a.host, a.port, a.method, a.rule) for a in rec.allowed] == [("127.0.0.1", origin.port, "GET", rule)]
    assert rec.blocked == [] and rec.proxy.stats.allowed == 1


async def test_a_host_no_rule_names_is_refused_and_reported(sock: Path) -> None:
    with origin_server({"/file": b"x"}) as origin:
        async with running_proxy(sock, ["pypi.org:443"], allowed_hosts="127.0.0.1") as rec:
            plain = await raw_exchange(sock, get(f"http://127.0.0.1:{origin.port}/file", f"127.0.0.1:{origin.port}"))
            tunnel = await raw_exchange(sock, b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n")
    assert status_of(plain) == 403 and b"no rule allows GET to 127.0.0.1" in plain
    assert status_of(tunnel) == 403
    assert origin.requests == []
    assert [(b.host, b.port, b.method, b.rules) for b in rec.blocked] == [
        ("127.0.0.1", origin.port, "GET", "allow-list"),
        ("example.com", 443, "CONNECT", "allow-list"),
    ]
    assert rec.allowed == [] and rec.proxy.stats.blocked == 2


async def test_loopback_needs_the_operator_allow_list(sock: Path) -> None:
    with origin_server({"/file": b"x"}) as origin:
        async with running_proxy(sock, [f"127.0.0.1:{origin.port}", "localhost"]) as rec:
            answer = await raw_exchange(sock, get(f"http://127.0.0.1:{origin.port}/file", f"127.0.0.1:{origin.port}"))
            by_name = await raw_exchange(sock, b"CONNECT localhost:443 HTTP/1.1\r\nHost: localhost:443\r\n\r\n")
    assert status_of(answer) == 403 and b"loopback" in answer
    assert status_of(by_name) == 403 and b"localhost resolves to" in by_name
    assert origin.requests == []
    assert [(b.rules, b.method) for b in rec.blocked] == [("address", "GET"), ("address", "CONNECT")]


async def test_connect_to_an_allowed_name_resolving_to_a_private_address_is_refused(sock: Path) -> None:
    answers = {"internal.example": ["10.1.2.3"], "mixed.example": ["93.184.215.14", "169.254.169.254"]}

    async def resolver(host: str, port: int) -> list[str]:
        return answers[host]

    async with running_proxy(sock, ["internal.example:443", "mixed.example:443"], resolver=resolver) as rec:
        private = await raw_exchange(sock, b"CONNECT internal.example:443 HTTP/1.1\r\nHost: internal.example\r\n\r\n")
        # One bad address in the answer refuses the name: the client could be steered to it.
        mixed = await raw_exchange(sock, b"CONNECT mixed.example:443 HTTP/1.1\r\nHost: mixed.example:443\r\n\r\n")
    assert status_of(private) == 403 and b"10.1.2.3" in private and b"private" in private
    assert status_of(mixed) == 403 and b"169.254.169.254" in mixed
    assert [(b.host, b.rules) for b in rec.blocked] == [("internal.example", "address"), ("mixed.example", "address")]


async def test_the_operator_allow_list_exempts_named_addresses_and_ports(sock: Path) -> None:
    async def resolver(host: str, port: int) -> list[str]:
        return ["127.0.0.1"]

    with origin_server({"/f": b"ok"}) as origin:
        port = origin.port
        async with running_proxy(sock, [f"index.test:{port}"], allowed_hosts=f"index.test:{port}", resolver=resolver):
            ok = await raw_exchange(sock, get(f"http://index.test:{port}/f", f"index.test:{port}"))
        async with running_proxy(sock, [f"index.test:{port}"], allowed_hosts="index.test:1", resolver=resolver):
            other_port = await raw_exchange(sock, get(f"http://index.test:{port}/f", f"index.test:{port}"))
        async with running_proxy(sock, [f"index.test:{port}"], allowed_hosts="127.0.0.0/8", resolver=resolver):
            by_cidr = await raw_exchange(sock, get(f"http://index.test:{port}/f", f"index.test:{port}"))
    assert status_of(ok) == 200 and status_of(by_cidr) == 200
    assert status_of(other_port) == 403


@pytest.mark.parametrize(
    ("request_bytes", "why"),
    [
        (b"GET http://127.0.0.1:{port}/file HTTP/1.1\r\nHost: evil.example\r\n\r\n", b"names another host"),
        (
            b"GET http://127.0.0.1:{port}/file HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nHost: evil\r\n\r\n",
            b"multiple Host",
        ),
        (b"GET /file HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n", b"this is a proxy"),
        (b"GET https://127.0.0.1:{port}/file HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n", b"through CONNECT"),
        (b"GET http://u:p@127.0.0.1:{port}/file HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n", b"userinfo"),
        (b"CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: evil.example:443\r\n\r\n", b"names another host"),
        (b"CONNECT 127.0.0.1 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", b"needs host:port"),
        (b"GET http://2130706433:{port}/file HTTP/1.1\r\nHost: 2130706433:{port}\r\n\r\n", b"no valid host"),
        (b"GARBAGE\r\n\r\n", b"malformed"),
        (
            b"POST http://127.0.0.1:{port}/file HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 5\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            b"frames its body twice",
        ),
    ],
)
async def test_ambiguous_or_smuggled_requests_are_refused(sock: Path, request_bytes: bytes, why: bytes) -> None:
    with origin_server({"/file": b"secret"}) as origin:
        data = request_bytes.replace(b"{port}", str(origin.port).encode())
        async with running_proxy(sock, [f"127.0.0.1:{origin.port}", "evil.example"], allowed_hosts="127.0.0.1") as rec:
            answer = await raw_exchange(sock, data)
    assert status_of(answer) == 400 and why in answer, answer
    assert origin.requests == []
    assert [b.rules for b in rec.blocked] == ["request"] and rec.allowed == []


async def test_method_and_path_rules(sock: Path) -> None:
    files = {"/simple/pkg/": b"index", "/admin": b"no"}
    with origin_server(files) as origin:
        base, host = f"http://127.0.0.1:{origin.port}", f"127.0.0.1:{origin.port}"
        async with running_proxy(sock, [f"GET {base}/simple/"], allowed_hosts="127.0.0.1") as rec:
            ok = await raw_exchange(sock, get(f"{base}/simple/pkg/", host))
            other_path = await raw_exchange(sock, get(f"{base}/admin", host))
            dots = await raw_exchange(sock, get(f"{base}/simple/../admin", host))
            encoded = await raw_exchange(sock, get(f"{base}/simple/%2e%2e/admin", host))
            post = await raw_exchange(
                sock, f"POST {base}/simple/pkg/ HTTP/1.1\r\nHost: {host}\r\nContent-Length: 1\r\n\r\nx".encode()
            )
            tunnel = await raw_exchange(sock, f"CONNECT {host} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    assert status_of(ok) == 200 and ok.endswith(b"index")
    assert [status_of(a) for a in (other_path, dots, encoded, post, tunnel)] == [403] * 5
    assert [p for _, p, _ in origin.requests] == ["/simple/pkg/"]
    assert [b.method for b in rec.blocked] == ["GET", "GET", "GET", "POST", "CONNECT"]


async def test_connect_tunnels_tls_end_to_end(sock: Path) -> None:
    ca, server_context = throwaway_ca()
    with origin_server({"/secure": b"over tls"}, tls=server_context) as origin:
        async with running_proxy(sock, [f"127.0.0.1:{origin.port}"], allowed_hosts="127.0.0.1") as rec:
            reader, writer = await asyncio.open_unix_connection(str(sock))
            writer.write(f"CONNECT 127.0.0.1:{origin.port} HTTP/1.1\r\nHost: 127.0.0.1:{origin.port}\r\n\r\n".encode())
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200 ")
            client_context = ssl.create_default_context()
            ca.configure_trust(client_context)
            await writer.start_tls(client_context, server_hostname="127.0.0.1")
            writer.write(f"GET /secure HTTP/1.1\r\nHost: 127.0.0.1:{origin.port}\r\nConnection: close\r\n\r\n".encode())
            answer = await asyncio.wait_for(reader.read(), 10)
            writer.close()
    assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"over tls")
    assert [(a.method, a.port) for a in rec.allowed] == [("CONNECT", origin.port)]


async def test_bodies_stream_both_ways_and_keep_alive_works(sock: Path) -> None:
    big = bytes(range(256)) * (64 * 1024)  # 16 MiB
    with origin_server({"/big": big}) as origin:
        base, host = f"http://127.0.0.1:{origin.port}", f"127.0.0.1:{origin.port}"
        async with running_proxy(sock, [host], allowed_hosts="127.0.0.1") as rec:
            reader, writer = await asyncio.open_unix_connection(str(sock), limit=1 << 20)
            # A chunked upload, echoed back; then a second request on the same connection.
            writer.write(f"POST {base}/echo HTTP/1.1\r\nHost: {host}\r\nTransfer-Encoding: chunked\r\n\r\n".encode())
            for i in range(0, len(big), 1 << 20):
                piece = big[i : i + (1 << 20)]
                writer.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
                await writer.drain()
            writer.write(b"0\r\n\r\n")
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200") and f"content-length: {len(big)}".encode() in head.lower()
            assert await reader.readexactly(len(big)) == big
            writer.write(get(f"{base}/big", host))
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200")
            assert await reader.readexactly(len(big)) == big
            assert await reader.read() == b""  # Connection: close was honoured
            writer.close()
    assert [m for m, _, _ in origin.requests] == ["POST", "GET"]
    assert rec.proxy.stats.allowed == 2


async def test_stalled_clients_and_closed_proxies_end_connections(sock: Path) -> None:
    async with running_proxy(sock, ["example.com"], timeouts=Timeouts(head=0.3, idle=0.5)) as rec:
        reader, writer = await asyncio.open_unix_connection(str(sock))
        writer.write(b"GET http://example.com/ HTTP/1.1\r\n")  # and then nothing
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()
        # A connection still open when the proxy closes ends with it.
        before = set(rec.proxy._clients)
        reader2, writer2 = await asyncio.open_unix_connection(str(sock))
        writer2.write(b"GET ")
        await until(lambda: rec.proxy._clients - before, timeout=10, what="the proxy to take the second connection")
        await rec.proxy.close()
        assert await asyncio.wait_for(reader2.read(), 5) == b""
        writer2.close()
    assert not sock.exists()


async def test_a_head_trickled_byte_by_byte_ends_at_one_deadline(sock: Path) -> None:
    """Each read is well inside the head timeout, but the whole head is not: the proxy hangs up."""
    async with running_proxy(sock, ["example.com"], timeouts=Timeouts(head=0.5, idle=5)):
        reader, writer = await asyncio.open_unix_connection(str(sock))
        loop = asyncio.get_running_loop()
        started = loop.time()
        closed = None
        for byte in b"GET http://example.com/ HTTP/1.1\r\nHost: example.com\r\nX-Slow: " + b"a" * 100:
            writer.write(bytes([byte]))
            try:
                await writer.drain()
            except ConnectionError:  # the proxy hung up between two reads
                closed = loop.time() - started
                break
            try:
                await asyncio.wait_for(reader.read(), 0.1)  # read() returns only at end of stream
            except TimeoutError:
                continue
            except ConnectionError:
                pass
            closed = loop.time() - started
            break
        writer.close()
    assert closed is not None and closed < 3, closed


async def test_unreachable_allowed_host_is_a_502_not_a_refusal(sock: Path) -> None:
    async def resolver(host: str, port: int) -> list[str]:
        raise OSError(-2, "Name or service not known")

    async with running_proxy(sock, ["nowhere.example"], resolver=resolver) as rec:
        answer = await raw_exchange(sock, b"CONNECT nowhere.example:443 HTTP/1.1\r\nHost: nowhere.example:443\r\n\r\n")
    assert status_of(answer) == 502 and b"does not resolve" in answer
    assert rec.blocked == [] and rec.allowed == []


async def test_the_sandboxes_own_loopback_relays_reach_the_run_channel(sock: Path) -> None:
    """A client that sends everything to the proxy (NO_PROXY is empty) still reaches the run's
    gateway at 127.0.0.1:4100: the proxy hands it to the channel socket, not to the host's
    loopback, and it is not egress (not counted, no rule needed)."""
    gateway = sock.parent / "gateway.sock"
    seen: list[bytes] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await reader.readuntil(b"\r\n\r\n"))
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 7\r\n\r\ngateway")
        await writer.drain()
        writer.close()

    server = await asyncio.start_unix_server(answer, path=str(gateway))
    try:
        async with running_proxy(sock, []) as rec:
            rec.proxy.dialer.loopback_sockets = {4100: gateway}
            plain = await raw_exchange(sock, get("http://127.0.0.1:4100/mcp", "127.0.0.1:4100"))
            other_port = await raw_exchange(sock, get("http://127.0.0.1:4101/mcp", "127.0.0.1:4101"))
    finally:
        server.close()
        await server.wait_closed()
    assert status_of(plain) == 200 and plain.endswith(b"gateway")
    assert seen[0].startswith(b"GET /mcp HTTP/1.1\r\n")
    assert status_of(other_port) == 403  # only the relay ports: the rest of loopback is the host's
    assert rec.proxy.stats.allowed == 0 and [b.port for b in rec.blocked] == [4101]
