"""The gateway's upstream HTTP/1.1 client: an httpx transport over asyncio streams that parses
answers with httptools (the C parser uvicorn uses on the agent's side), instead of httpcore and
h11. Every streamed event passes two parsers on its way through the gateway; with h11's pure
Python one on the upstream side, the gateway's own CPU per streamed call measured about 3.5x what
it is with this client (tests/bench/bench_gateway.py prints both paths), and that is what a busy
worker pays per event of every agent.

What it does, and no more: POST-style requests with a body known up front, keep-alive
connections kept per (scheme, host, port) and reused once the previous answer ended cleanly (a
reused connection the server had closed is retried once on a new one, before any byte of an
answer), TLS with certifi's roots and the URL's host for SNI and the certificate, httpx's timeouts
(`connect` for resolving and connecting, `write`, `read` for each wait for bytes), httpx's error
types. With a `GuardedBackend` (tasks/run/gateway/guard.py) the host is resolved once, every
address checked, and the socket opened to a checked address."""

import asyncio
import contextlib
import ssl
from collections import deque
from collections.abc import AsyncIterator, Awaitable
from typing import Any, TypeVar

import httpcore
import httptools
import httpx

from webhooks.urlguard import AddressRefused, GuardedBackend

T = TypeVar("T")
Key = tuple[bytes, str, int]
MAX_IDLE = 16  # idle connections kept per endpoint (a run's gateway serves at most 16 calls at once)
READ_SIZE = 64 * 1024
ALLOWED_HOSTS_SETTING = "FORGEHAND_MODEL_ALLOWED_HOSTS"


class EndpointRefused(httpx.ConnectError):
    """The endpoint's host is (or resolves to) an address the guard refuses; nothing was sent."""


class _Conn:
    __slots__ = ("reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    def close(self) -> None:
        self.writer.close()


class _Answer:
    """httptools' callbacks: the status, headers and body pieces of one answer."""

    def __init__(self) -> None:
        self.headers: list[tuple[bytes, bytes]] = []
        self.head_done = False
        self.until_close = False
        self.complete = False
        self.keep_alive = False  # read when the answer ends (the parser forgets it after)
        self.body: deque[bytes] = deque()
        self.parser = httptools.HttpResponseParser(self)

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.head_done = True
        names = {name.lower() for name, _ in self.headers}
        # Neither a length nor chunks: the body ends when the server closes the connection.
        self.until_close = b"content-length" not in names and b"transfer-encoding" not in names

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.complete = True
        self.keep_alive = self.parser.should_keep_alive()


async def _within(seconds: float | None, what: Awaitable[T], error: type[httpx.TimeoutException], text: str) -> T:
    try:
        async with asyncio.timeout(seconds):
            return await what
    except TimeoutError:
        raise error(text) from None


class _Body(httpx.AsyncByteStream):
    def __init__(self, transport: "UpstreamTransport", key: Key, conn: _Conn, answer: _Answer, read: float | None):
        self._transport = transport
        self._key = key
        self._conn: _Conn | None = conn
        self._answer = answer
        self._read = read

    async def __aiter__(self) -> AsyncIterator[bytes]:
        answer = self._answer
        while True:
            while answer.body:
                yield answer.body.popleft()
            if answer.complete:
                break
            assert self._conn is not None
            data = await _read(self._conn, self._read)
            if not data:
                if answer.until_close:
                    break
                raise httpx.RemoteProtocolError("the server closed the connection before the answer ended")
            _feed(answer, data)
        conn, self._conn = self._conn, None
        if conn is not None:
            self._transport.release(self._key, conn, keep=answer.keep_alive and answer.complete)

    async def aclose(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:  # the answer was not read to its end: the connection is not reusable
            conn.close()


async def _read(conn: _Conn, seconds: float | None) -> bytes:
    try:
        async with asyncio.timeout(seconds):
            return await conn.reader.read(READ_SIZE)
    except TimeoutError:
        raise httpx.ReadTimeout(f"no byte of the answer for {seconds} s") from None
    except OSError as exc:
        raise httpx.ReadError(str(exc) or type(exc).__name__) from exc


def _feed(answer: _Answer, data: bytes) -> None:
    try:
        answer.parser.feed_data(data)
    except httptools.HttpParserError as exc:
        raise httpx.RemoteProtocolError(f"the answer is not valid HTTP/1.1: {exc}") from exc


class UpstreamTransport(httpx.AsyncBaseTransport):
    def __init__(self, guard: GuardedBackend | None = None, ssl_context: ssl.SSLContext | None = None) -> None:
        self.guard = guard
        self._ssl = ssl_context
        self._idle: dict[Key, list[_Conn]] = {}

    def _tls(self) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = httpx.create_ssl_context(trust_env=False)
        return self._ssl

    async def _connect(self, key: Key, seconds: float | None) -> _Conn:
        scheme, host, port = key
        tls = self._tls() if scheme == b"https" else None
        addresses = [host]
        if self.guard is not None:
            try:
                addresses = await self.guard.resolve_checked(host, port, seconds)
            except AddressRefused as exc:
                raise EndpointRefused(f"{exc} (allow-list it in {ALLOWED_HOSTS_SETTING})") from None
            except httpcore.ConnectTimeout as exc:
                raise httpx.ConnectTimeout(str(exc)) from None
            except httpcore.ConnectError as exc:
                raise httpx.ConnectError(str(exc)) from None
        last: Exception = httpx.ConnectError(f"{host} has no address")
        for address in addresses:
            opening = asyncio.open_connection(address, port, ssl=tls, server_hostname=host if tls else None)
            try:
                text = f"connecting to {host} timed out"
                reader, writer = await _within(seconds, opening, httpx.ConnectTimeout, text)
            except OSError as exc:  # refused, unreachable, TLS failures (ssl.SSLError is an OSError)
                last = httpx.ConnectError(f"cannot connect to {host}:{port}: {exc.strerror or exc}")
                continue
            return _Conn(reader, writer)
        raise last

    def release(self, key: Key, conn: _Conn, *, keep: bool) -> None:
        idle = self._idle.setdefault(key, [])
        if keep and len(idle) < MAX_IDLE and not conn.reader.at_eof():
            idle.append(conn)
        else:
            conn.close()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        key: Key = (url.raw_scheme, url.host, url.port or (443 if url.raw_scheme == b"https" else 80))
        timeouts: dict[str, Any] = request.extensions.get("timeout", {})
        body = await request.aread()
        head = [request.method.encode(), b" ", url.raw_path, b" HTTP/1.1\r\n"]
        for name, value in request.headers.raw:
            head += (name, b": ", value, b"\r\n")
        head.append(b"\r\n")
        message = b"".join(head) + body
        idle = self._idle.get(key)
        while idle and idle[-1].reader.at_eof():
            idle.pop().close()
        reused = bool(idle)
        conn = idle.pop() if idle else await self._connect(key, timeouts.get("connect"))
        while True:
            try:
                return await self._exchange(key, conn, message, timeouts)
            except (httpx.RemoteProtocolError, httpx.ReadError):
                conn.close()
                if not reused:
                    raise
                # A kept-alive connection the server had closed before reading the request.
                reused = False
                conn = await self._connect(key, timeouts.get("connect"))
            except BaseException:
                conn.close()
                raise

    async def _exchange(self, key: Key, conn: _Conn, message: bytes, timeouts: dict[str, Any]) -> httpx.Response:
        try:
            conn.writer.write(message)
            await _within(timeouts.get("write"), conn.writer.drain(), httpx.WriteTimeout, "the write timed out")
        except OSError as exc:
            raise httpx.RemoteProtocolError(f"the connection broke while sending ({exc})") from exc
        answer = _Answer()
        while not answer.head_done:
            data = await _read(conn, timeouts.get("read"))
            if not data:
                raise httpx.RemoteProtocolError("the server closed the connection without answering")
            _feed(answer, data)
        status = answer.parser.get_status_code()
        stream = _Body(self, key, conn, answer, timeouts.get("read"))
        return httpx.Response(status, headers=answer.headers, stream=stream)

    async def aclose(self) -> None:
        for idle in self._idle.values():
            for conn in idle:
                with contextlib.suppress(Exception):
                    conn.close()
        self._idle.clear()
