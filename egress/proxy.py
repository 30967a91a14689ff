"""The egress proxy: an HTTP/1.1 forward proxy on one run's Unix socket (`egress.sock` in its
channel directory; the sandbox reaches it through the relay on 127.0.0.1:3128).

CONNECT opens a tunnel (HTTPS); an absolute-form request (`GET http://host/path`) is forwarded as
plain HTTP (forward.py). Before anything is connected, the request must be well-formed and
unambiguous (one Host header, naming the same host as the target), the rules must allow it
(rules.py), and every address of the host must pass the address check (addresses.py). A refusal
answers 400 or 403 and is reported (`on_blocked`); each connection made is counted and reported
(`on_allowed`). The callbacks are plain functions: whoever records them must not block the proxy.

HTTP parsing is h11's (the sans-I/O HTTP/1.1 library httpcore and uvicorn use): request heads,
framing (Content-Length, chunked), keep-alive and CONNECT's switch to a tunnel are its job; this
module holds the policy and moves the bytes. A ready-made proxy server (proxy.py, mitmproxy) would
bring its own process model and plugin API around the one thing this must own: the check of every
resolved address before the socket is opened, with events per run.
"""

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import h11

from egress.addresses import Dialer, Refused, Unreachable
from egress.forward import forward_request
from egress.http11 import (
    HEAD_LIMIT,
    READ_SIZE,
    Allowed,
    Blocked,
    RefusedRequest,
    Timeouts,
    check_host_header,
    next_event,
    send_refusal,
)
from egress.rules import RuleSet, split_authority

SOCKET_NAME = "egress.sock"


@dataclass
class Stats:
    allowed: int = 0
    blocked: int = 0


@dataclass
class EgressProxy:
    socket_path: Path
    rules: RuleSet
    dialer: Dialer = field(default_factory=Dialer)
    on_blocked: Callable[[Blocked], None] | None = None
    on_allowed: Callable[[Allowed], None] | None = None
    timeouts: Timeouts = field(default_factory=Timeouts)
    max_connections: int = 64

    def __post_init__(self) -> None:
        self.stats = Stats()
        self._server: asyncio.Server | None = None
        self._clients: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_unix_server(self._accept, path=str(self.socket_path), limit=HEAD_LIMIT)
        # Any uid may connect: the sandbox user is not ours; only the run's container sees the directory.
        self.socket_path.chmod(0o666)

    async def close(self) -> None:
        """Stop accepting, end every connection (tunnels included), remove the socket. Idempotent."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for task in list(self._clients):
            task.cancel()
        if self._clients:
            await asyncio.wait(list(self._clients), timeout=5)
        if server is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(server.wait_closed(), 5)
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()

    # --- reporting ----------------------------------------------------------------------------

    def blocked(self, blocked: Blocked) -> None:
        self.stats.blocked += 1
        if self.on_blocked is not None:
            self.on_blocked(blocked)

    def allowed(self, allowed: Allowed) -> None:
        if allowed.internal:
            return
        self.stats.allowed += 1
        if self.on_allowed is not None:
            self.on_allowed(allowed)

    # --- connections --------------------------------------------------------------------------

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._clients.add(task)
        try:
            if len(self._clients) > self.max_connections:
                conn = h11.Connection(h11.SERVER)
                why = f"more than {self.max_connections} connections at once"
                await send_refusal(conn, writer, 503, why)
                self.blocked(Blocked(host="", port=0, method="", rules="limit", reason=why))
                return
            await self._serve(reader, writer)
        except (ConnectionError, TimeoutError, asyncio.IncompleteReadError):
            pass
        finally:
            self._clients.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=HEAD_LIMIT)
        while True:
            try:
                event = await next_event(conn, reader, self.timeouts.head)
            except h11.RemoteProtocolError as exc:
                await send_refusal(conn, writer, 400, f"malformed request: {exc}")
                self.blocked(Blocked(host="", port=0, method="", rules="request", reason=f"malformed request: {exc}"))
                return
            if not isinstance(event, h11.Request):
                return  # the client closed between requests
            method = event.method.decode("ascii", "replace")
            try:
                if method == "CONNECT":
                    await self._tunnel(conn, event, reader, writer)
                    return
                keep = await forward_request(self, conn, event, reader, writer)
            except RefusedRequest as refused:
                await send_refusal(conn, writer, refused.status, refused.blocked.reason)
                self.blocked(refused.blocked)
                return
            except h11.RemoteProtocolError:
                return  # a body that broke its framing: the request was already under way
            if not keep or conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                return
            conn.start_next_cycle()

    async def check_target(self, method: str, host: str, port: int, allowed_by: str | None) -> Allowed:
        """Refuse what no rule allows; otherwise the report of the connection about to be made."""
        if self.dialer.channel_socket(host, port) is not None:
            return Allowed(host=host, port=port, method=method, rule="the run's channel", internal=True)
        if allowed_by is None:
            raise RefusedRequest(
                403, Blocked(host, port, method, "allow-list", f"no rule allows {method} to {host}:{port}")
            )
        return Allowed(host=host, port=port, method=method, rule=allowed_by)

    async def dial(self, allowed: Allowed) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        try:
            return await self.dialer.connect(allowed.host, allowed.port)
        except Refused as exc:
            raise RefusedRequest(
                403 if exc.rules == "address" else 400,
                Blocked(allowed.host, allowed.port, allowed.method, exc.rules, exc.reason),
            ) from None

    async def _tunnel(
        self, conn: h11.Connection, request: h11.Request, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        target = request.target.decode("ascii", "replace")
        split = split_authority(target)
        if split is None or split[1] is None:
            raise RefusedRequest(400, Blocked(target[:200], 0, "CONNECT", "request", "CONNECT needs host:port"))
        host, port = split[0], split[1]
        check_host_header(request, host, port, port, "CONNECT")
        rule = self.rules.allows_connect(host, port)
        allowed = await self.check_target("CONNECT", host, port, rule.text if rule else None)
        try:
            up_reader, up_writer = await self.dial(allowed)
        except Unreachable as exc:
            await send_refusal(conn, writer, 504 if exc.timeout else 502, str(exc))
            return
        try:
            self.allowed(allowed)
            writer.write(conn.send(h11.Response(status_code=200, headers=[], reason=b"Connection Established")))
            await writer.drain()
            early, _closed = conn.trailing_data  # bytes the client sent after the request head
            if early:
                up_writer.write(early)
            await splice(reader, writer, up_reader, up_writer, self.timeouts.idle)
        finally:
            up_writer.close()


async def splice(
    a_reader: asyncio.StreamReader,
    a_writer: asyncio.StreamWriter,
    b_reader: asyncio.StreamReader,
    b_writer: asyncio.StreamWriter,
    idle: float,
) -> None:
    """Bytes both ways until both sides are done, half-closes passed on; ends when no byte moved
    in either direction for `idle` seconds (one direction may be quiet for a whole download)."""
    last = time.monotonic()

    async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal last
        while data := await reader.read(READ_SIZE):
            last = time.monotonic()
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            with contextlib.suppress(OSError):
                writer.write_eof()

    pumps = [asyncio.ensure_future(pump(a_reader, b_writer)), asyncio.ensure_future(pump(b_reader, a_writer))]
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
