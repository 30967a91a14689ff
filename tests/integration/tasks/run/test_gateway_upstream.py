"""The gateway's upstream client (httptools over asyncio streams) against real servers on
127.0.0.1: bodies by length, chunked and until close; kept-alive connections reused, a stale one
retried once; TLS with the URL's host for SNI and the certificate; httpx's timeouts and errors."""

import asyncio
import contextlib
import datetime
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tasks.run.gateway.upstream import UpstreamTransport
from tests.support.waiting import event, until

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@asynccontextmanager
async def server(handler: Handler, tls: ssl.SSLContext | None = None) -> AsyncIterator[tuple[int, list[int]]]:
    """A raw TCP server; yields its port and the list of connections it accepted (by number)."""
    accepted: list[int] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(len(accepted) + 1)
        try:
            await handler(reader, writer)
        finally:
            writer.close()

    srv = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=tls)
    try:
        yield srv.sockets[0].getsockname()[1], accepted
    finally:
        srv.close()
        await srv.wait_closed()


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        (int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")), 0
    )
    return head + await reader.readexactly(length)


def client() -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=UpstreamTransport(), timeout=5)


async def test_bodies_by_length_chunked_and_until_close_and_connections_reused() -> None:
    seen: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for answer in (
            b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n{"a": true}',
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
            b"HTTP/1.1 429 Too Many\r\nretry-after: 3\r\nconnection: close\r\n\r\nslow down",
        ):
            seen.append(await read_request(reader))
            writer.write(answer)
            await writer.drain()

    async with server(handler) as (port, accepted), client() as c:
        first = await c.post(f"http://127.0.0.1:{port}/v1/x?q=1", content=b'{"b": 1}', headers={"x-key": "k"})
        async with c.stream("POST", f"http://127.0.0.1:{port}/v1/y", content=b"{}") as second:
            pieces = [p async for p in second.aiter_raw()]
        third = await c.post(f"http://127.0.0.1:{port}/v1/z", content=b"{}")
    assert first.status_code == 200 and first.json() == {"a": True}
    assert b"".join(pieces) == b"hello world" and len(pieces) == 2
    assert third.status_code == 429 and third.headers["retry-after"] == "3" and third.text == "slow down"
    assert accepted == [1]  # one connection, kept alive across the three calls
    assert seen[0].startswith(b"POST /v1/x?q=1 HTTP/1.1\r\n") and b"x-key: k" in seen[0]
    assert seen[0].endswith(b'\r\n\r\n{"b": 1}') and b"host: 127.0.0.1:" in seen[0].lower()


async def test_a_kept_alive_connection_the_server_closed_is_retried_on_a_new_one() -> None:
    closed = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        await writer.drain()
        # then close the kept-alive connection without a word (an idle timeout on the server)
        writer.close()
        await writer.wait_closed()
        closed.set()

    async with server(handler) as (port, accepted), client() as c:
        assert (await c.post(f"http://127.0.0.1:{port}/", content=b"1")).text == "ok"
        await event(closed, timeout=10, what="the server to close the kept-alive connection")
        assert (await c.post(f"http://127.0.0.1:{port}/", content=b"2")).text == "ok"
    assert accepted == [1, 2]


async def test_a_pipelined_second_answer_is_never_part_of_the_first_nor_reused() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            with contextlib.suppress(asyncio.IncompleteReadError):
                await read_request(reader)
                # One write: the answer, and a second one nobody asked for right behind it.
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nhi")
                writer.write(b"HTTP/1.1 200 OK\r\nx-evil: 1\r\ncontent-length: 3\r\n\r\nabc")
                await writer.drain()
                continue
            return

    async with server(handler) as (port, accepted), client() as c:
        first = await c.post(f"http://127.0.0.1:{port}/", content=b"1")
        second = await c.post(f"http://127.0.0.1:{port}/", content=b"2")
    assert (first.text, second.text) == ("hi", "hi")
    assert "x-evil" not in first.headers and first.headers.get_list("content-length") == ["2"]
    assert accepted == [1, 2]  # the connection that carried the extra answer was not reused


async def test_an_answer_head_over_64_kib_is_an_error() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nx-big: " + b"a" * (100 * 1024) + b"\r\ncontent-length: 2\r\n\r\nok")
        await writer.drain()

    async with server(handler) as (port, _accepted), client() as c:
        with pytest.raises(httpx.RemoteProtocolError, match="over 64 KiB"):
            await c.post(f"http://127.0.0.1:{port}/", content=b"x")


async def test_a_first_connection_that_breaks_is_an_error_not_a_retry() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)

    async with server(handler) as (port, accepted), client() as c:
        with pytest.raises(httpx.RemoteProtocolError):
            await c.post(f"http://127.0.0.1:{port}/", content=b"x")
    assert accepted == [1]


async def test_timeouts_and_refused_connections_are_httpx_errors() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await asyncio.sleep(5)  # the scenario: no answer within the client's 0.3 s (then it hangs up)

    async def stalls_mid_body(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nhi\r\n")
        await writer.drain()
        await asyncio.sleep(5)  # the scenario: the body stalls past the client's 0.3 s

    async with server(silent) as (port, _), httpx.AsyncClient(transport=UpstreamTransport(), timeout=0.3) as c:
        with pytest.raises(httpx.ReadTimeout):
            await c.post(f"http://127.0.0.1:{port}/", content=b"x")
    got = []
    async with (
        server(stalls_mid_body) as (port, _),
        httpx.AsyncClient(transport=UpstreamTransport(), timeout=0.3) as c,
        c.stream("POST", f"http://127.0.0.1:{port}/", content=b"x") as r,
    ):
        with pytest.raises(httpx.ReadTimeout):
            async for piece in r.aiter_raw():
                got.append(piece)
    assert got == [b"hi"]
    async with client() as c:
        with pytest.raises(httpx.ConnectError):
            await c.post("http://127.0.0.1:9/", content=b"x")


def _certificate(tmp_path: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


async def test_tls_checks_the_certificate_against_the_url_host(tmp_path: Path) -> None:
    cert, key = _certificate(tmp_path)
    served = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    served.load_cert_chain(cert, key)
    trusting = ssl.create_default_context(cafile=str(cert))

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 6\r\n\r\nsecure")
        await writer.drain()

    async with server(handler, tls=served) as (port, _):
        async with httpx.AsyncClient(transport=UpstreamTransport(ssl_context=trusting), timeout=5) as c:
            ok = await c.post(f"https://localhost:{port}/", content=b"x")
            with pytest.raises(httpx.ConnectError):  # the certificate names localhost, not this address
                await c.post(f"https://127.0.0.1:{port}/", content=b"x")
        async with client() as c:  # the system's roots do not know this certificate
            with pytest.raises(httpx.ConnectError):
                await c.post(f"https://localhost:{port}/", content=b"x")
    assert ok.text == "secure"


def sse_chunk(i: int) -> bytes:
    event = b'event: content_block_delta\ndata: {"type":"content_block_delta","delta":{"text":"%d"}}\n\n' % i
    return b"%x\r\n%s\r\n" % (len(event), event)


async def test_what_arrives_together_is_handed_on_as_one_piece() -> None:
    pieces = [sse_chunk(i) for i in range(20)]

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        # the head and every event in one write, as a burst from one socket read
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + b"".join(pieces) + b"0\r\n\r\n")
        await writer.drain()

    transport = UpstreamTransport()
    async with server(handler) as (port, _):
        answer = await transport.open(f"http://127.0.0.1:{port}/v1/messages", [], b"{}", 5)
        got = [await answer.next()]
        await answer.aclose()
    await transport.aclose()
    events = b"".join(p.split(b"\r\n", 1)[1][:-2] for p in pieces)
    assert got == [(events, True)]


async def test_a_slow_agent_holds_the_upstream_read_back() -> None:
    total = 64 * 1024 * 1024
    written: list[int] = []
    stalled = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % total)
        piece = b"x" * (256 * 1024)
        sent = 0
        while sent < total:
            writer.write(piece)
            sent += len(piece)
            written.append(sent)
            try:
                await asyncio.wait_for(writer.drain(), 0.5)
            except TimeoutError:
                stalled.set()  # the client reads nothing more: the upstream is held back
                await writer.drain()

    transport = UpstreamTransport()
    async with server(handler) as (port, _):
        answer = await transport.open(f"http://127.0.0.1:{port}/", [], b"{}", 10)
        first, _ = await answer.next()
        await asyncio.wait_for(stalled.wait(), 10)
        held = written[-1]
        got, ended = len(first), False
        while not ended:
            piece, ended = await answer.next()
            got += len(piece)
    await transport.aclose()
    # Not read: at most the socket buffers' and the stream reader's worth, far from the whole body.
    assert held < total // 2
    assert got == total


async def test_a_connection_opened_ahead_is_the_one_the_first_call_uses() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        await writer.drain()
        await read_request(reader)  # kept alive for the next call

    transport = UpstreamTransport()
    async with server(handler) as (port, accepted):
        await transport.preconnect(f"http://127.0.0.1:{port}/v1/messages", 5)
        await until(lambda: accepted, timeout=10, what="the server to accept the connection opened ahead")
        assert accepted == [1]  # connected before any call
        answer = await transport.open(f"http://127.0.0.1:{port}/v1/messages", [], b"{}", 5)
        assert await answer.next() == (b"ok", True)
        assert accepted == [1]
        await transport.preconnect(f"http://127.0.0.1:{port}/v1/messages", 5)  # one is idle: none more
        assert accepted == [1]
    await transport.aclose()
