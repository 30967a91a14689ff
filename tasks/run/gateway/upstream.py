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
address checked, and the socket opened to a checked address. One connection, and the parser of
its answers, are `connection.py`."""

import asyncio
import contextlib
import functools
import ssl
from collections.abc import AsyncIterator
from typing import Any

import httpcore
import httpx

from forge.core.addresses import ask_admin
from forge.core.urlguard import AddressRefused, GuardedBackend
from tasks.run.gateway.connection import AnswerParser, Connection, within

Key = tuple[bytes, str, int]
MAX_IDLE = 16  # idle connections kept per endpoint (a run's gateway serves at most 16 calls at once)
ALLOWED_HOSTS_SETTING = "FORGEHAND_MODEL_ALLOWED_HOSTS"


class EndpointRefused(httpx.ConnectError):
    """The endpoint's host is (or resolves to) an address the guard refuses; nothing was sent."""


@functools.lru_cache(maxsize=256)
def _target(url: str) -> tuple[Key, bytes, bytes]:
    """(the connection's key, the request target, the Host header) of a URL, parsed once."""
    parsed = httpx.URL(url)
    scheme = parsed.raw_scheme
    key: Key = (scheme, parsed.host, parsed.port or (443 if scheme == b"https" else 80))
    return key, parsed.raw_path, parsed.netloc


class Answer:
    """One upstream answer, its head read: the status, the headers, and the body as it arrives.
    `next` hands over everything that arrived since the last call as one piece (a burst of
    events read in one go reaches the agent in one write), with whether the body ended with it,
    so the agent's last piece and the stream's end can leave together. While the agent's side
    does not ask for more, nothing is read: the connection's own buffer fills and the upstream
    is paused (a slow agent slows the upstream, memory stays bounded)."""

    __slots__ = ("_answer", "_conn", "_key", "_read", "_transport", "headers", "status")

    def __init__(
        self, transport: "UpstreamTransport", key: Key, conn: Connection, answer: AnswerParser, read: float | None
    ):
        self._transport = transport
        self._key = key
        self._conn: Connection | None = conn
        self._answer = answer
        self._read = read
        self.status: int = answer.parser.get_status_code()
        self.headers = answer.headers

    def header(self, name: bytes) -> bytes:
        """The first value of a header (name in lower case), b"" when absent."""
        return next((v for k, v in self.headers if k.lower() == name), b"")

    async def _more(self) -> None:
        answer, conn = self._answer, self._conn
        if conn is None:
            raise httpx.ReadError("the answer was closed")
        await conn.wait(self._read)
        if conn.error is not None:
            raise conn.error
        if not answer.body and not answer.complete and conn.closed:
            if not answer.until_close:
                raise httpx.RemoteProtocolError("the server closed the connection before the answer ended")
            answer.complete, answer.keep_alive = True, False

    def _release(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            self._transport.release(self._key, conn, keep=self._answer.keep_alive)

    async def next(self) -> tuple[bytes, bool]:
        """(what arrived, whether the body ended with it); raises httpx's errors."""
        answer = self._answer
        while not answer.body and not answer.complete:
            await self._more()
        body = answer.body
        piece = body.popleft() if len(body) == 1 else b"".join(body)
        body.clear()
        answer.held = 0
        if self._conn is not None:
            self._conn.taken()
        if answer.complete:
            self._release()
        return piece, answer.complete

    async def pieces(self) -> AsyncIterator[bytes]:
        """The body piece by piece as the parser gave them (httpx's `aiter_raw`)."""
        answer = self._answer
        while True:
            while answer.body:
                piece = answer.body.popleft()
                answer.held -= len(piece)
                yield piece
            if self._conn is not None:
                self._conn.taken()
            if answer.complete:
                self._release()
                return
            await self._more()

    async def aclose(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:  # the answer was not read to its end: the connection is not reusable
            conn.close()


class _Body(httpx.AsyncByteStream):
    def __init__(self, answer: Answer) -> None:
        self._answer = answer

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for piece in self._answer.pieces():
            yield piece

    async def aclose(self) -> None:
        await self._answer.aclose()


class UpstreamTransport(httpx.AsyncBaseTransport):
    def __init__(self, guard: GuardedBackend | None = None, ssl_context: ssl.SSLContext | None = None) -> None:
        self.guard = guard
        self._ssl = ssl_context
        self._idle: dict[Key, list[Connection]] = {}

    def _tls(self) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = httpx.create_ssl_context(trust_env=False)
        return self._ssl

    async def _connect(self, key: Key, seconds: float | None) -> Connection:
        scheme, host, port = key
        tls = self._tls() if scheme == b"https" else None
        addresses = [host]
        if self.guard is not None:
            try:
                addresses = await self.guard.resolve_checked(host, port, seconds)
            except AddressRefused as exc:
                fix = f"{ask_admin(host, 'model endpoints')}, or the operator in {ALLOWED_HOSTS_SETTING}"
                raise EndpointRefused(f"{exc.why}; {fix}") from None
            except httpcore.ConnectTimeout as exc:
                raise httpx.ConnectTimeout(str(exc)) from None
            except httpcore.ConnectError as exc:
                raise httpx.ConnectError(str(exc)) from None
        last: Exception = httpx.ConnectError(f"{host} has no address")
        loop = asyncio.get_running_loop()
        for address in addresses:
            opening = loop.create_connection(
                lambda: Connection(loop), address, port, ssl=tls, server_hostname=host if tls else None
            )
            try:
                text = f"connecting to {host} timed out"
                _, conn = await within(seconds, opening, httpx.ConnectTimeout, text)
            except OSError as exc:  # refused, unreachable, TLS failures (ssl.SSLError is an OSError)
                last = httpx.ConnectError(f"cannot connect to {host}:{port}: {exc.strerror or exc}")
                continue
            return conn
        raise last

    async def preconnect(self, url: str, seconds: float | None) -> None:
        """Open a connection to `url`'s endpoint ahead of the first call (TCP and TLS handshakes
        then fall outside the agent's first time to first byte); kept like a released one."""
        key, _, _ = _target(url)
        if not self._idle.get(key):
            self.release(key, await self._connect(key, seconds), keep=True)

    def release(self, key: Key, conn: Connection, *, keep: bool) -> None:
        idle = self._idle.setdefault(key, [])
        conn.answer = None
        if keep and len(idle) < MAX_IDLE and not conn.closed:
            idle.append(conn)
        else:
            conn.close()

    async def open(self, url: str, headers: list[tuple[bytes, bytes]], body: bytes, seconds: float | None) -> Answer:
        """POST `body` to `url` and read the answer's head: the gateway's own path, without
        building httpx's request and response objects (their URL parsing, header models and
        cookie handling were a third of the gateway's CPU per call). `seconds` is each of
        httpx's (connect, write, each read)."""
        key, target, host = _target(url)
        head = [b"POST ", target, b" HTTP/1.1\r\nhost: ", host, b"\r\ncontent-length: ", b"%d" % len(body), b"\r\n"]
        for name, value in headers:
            head += (name, b": ", value, b"\r\n")
        head.append(b"\r\n")
        return await self._send(key, b"".join(head) + body, seconds, seconds, seconds)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        key, _, _ = _target(str(request.url))
        timeouts: dict[str, Any] = request.extensions.get("timeout", {})
        body = await request.aread()
        head = [request.method.encode(), b" ", request.url.raw_path, b" HTTP/1.1\r\n"]
        for name, value in request.headers.raw:
            head += (name, b": ", value, b"\r\n")
        head.append(b"\r\n")
        message = b"".join(head) + body
        answer = await self._send(key, message, timeouts.get("connect"), timeouts.get("write"), timeouts.get("read"))
        return httpx.Response(answer.status, headers=answer.headers, stream=_Body(answer))

    async def _send(
        self, key: Key, message: bytes, connect: float | None, write: float | None, read: float | None
    ) -> Answer:
        idle = self._idle.get(key)
        while idle and idle[-1].closed:
            idle.pop().close()
        reused = bool(idle)
        conn = idle.pop() if idle else await self._connect(key, connect)
        while True:
            try:
                return await self._exchange(key, conn, message, write, read)
            except (httpx.RemoteProtocolError, httpx.ReadError):
                conn.close()
                if not reused:
                    raise
                # A kept-alive connection the server had closed before reading the request.
                reused = False
                conn = await self._connect(key, connect)
            except BaseException:
                conn.close()
                raise

    async def _exchange(
        self, key: Key, conn: Connection, message: bytes, write: float | None, read: float | None
    ) -> Answer:
        answer = conn.answer = AnswerParser()
        await conn.write(message, write)
        while not answer.head_done:
            await conn.wait(read)
            if conn.error is not None:
                raise conn.error
            if not answer.head_done and conn.closed:
                raise httpx.RemoteProtocolError("the server closed the connection without answering")
        return Answer(self, key, conn, answer, read)

    async def aclose(self) -> None:
        for idle in self._idle.values():
            for conn in idle:
                with contextlib.suppress(Exception):
                    conn.close()
        self._idle.clear()
