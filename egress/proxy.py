"""The egress proxy: an HTTP/1.1 forward proxy on one run's Unix socket (`egress.sock` in its
channel directory; the sandbox reaches it through the relay on 127.0.0.1:3128).

CONNECT opens a tunnel (HTTPS); an absolute-form request (`GET http://host/path`) is forwarded as
plain HTTP (forward.py). Before anything is connected, the request must be well-formed and
unambiguous (one Host header, naming the same host as the target), the rules must allow it
(rules.py), and every address of the host must pass the address check (addresses.py). A tunnel's
first client bytes are held back until checked: a TLS ClientHello must ask for the CONNECT host
(tls.py: a shared front end routes by that name). A refusal answers 400 or 403 (a tunnel refused
for its hello is closed) and is reported (`on_blocked`); each connection made is counted and
reported (`on_allowed`). Once checked, bytes are pumped, not parsed (pump.py). The callbacks are
plain functions: whoever records them must not block the proxy.

HTTP parsing is h11's (the sans-I/O HTTP/1.1 library httpcore and uvicorn use): request heads,
framing (Content-Length, chunked), keep-alive and CONNECT's switch to a tunnel are its job; this
module holds the policy and moves the bytes. A ready-made proxy server (proxy.py, mitmproxy) would
bring its own process model and plugin API around the one thing this must own: the check of every
resolved address before the socket is opened, with events per run.
"""

import asyncio
import contextlib
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import h11

from egress.addresses import Dialer, Refused, Unreachable
from egress.forward import forward_request
from egress.http11 import (
    HEAD_LIMIT,
    Allowed,
    Blocked,
    RefusedRequest,
    Timeouts,
    check_host_header,
    next_event,
    send,
    send_refusal,
)
from egress.pump import tunnel
from egress.rules import RuleSet, normalize_host, split_authority
from egress.sockio import Conn, widen_buffers
from egress.tls import HELLO_LIMIT, MalformedHello, is_tls_handshake, read_client_hello

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
        self._listener: socket.socket | None = None
        self._acceptor: asyncio.Task[None] | None = None
        self._clients: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(self.socket_path))
        # Any uid may connect: the sandbox user is not ours; only the run's container sees the directory.
        self.socket_path.chmod(0o666)
        listener.listen(128)
        listener.setblocking(False)
        self._listener = listener
        self._acceptor = asyncio.ensure_future(self._accept_loop(listener))

    async def close(self) -> None:
        """Stop accepting, end every connection (tunnels included), remove the socket. Idempotent."""
        acceptor, self._acceptor = self._acceptor, None
        if acceptor is not None:
            acceptor.cancel()
            await asyncio.gather(acceptor, return_exceptions=True)
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
        for task in list(self._clients):
            task.cancel()
        if self._clients:
            await asyncio.wait(list(self._clients), timeout=5)
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

    async def _accept_loop(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            client, _ = await loop.sock_accept(listener)
            widen_buffers(client)
            task = asyncio.ensure_future(self._client(Conn(client)))
            self._clients.add(task)
            task.add_done_callback(self._clients.discard)

    async def _client(self, client: Conn) -> None:
        try:
            if len(self._clients) > self.max_connections:
                why = f"more than {self.max_connections} connections at once"
                await send_refusal(h11.Connection(h11.SERVER), client, 503, why)
                self.blocked(Blocked(host="", port=0, method="", rules="limit", reason=why))
                return
            await self._serve(client)
        except (OSError, TimeoutError):
            pass
        finally:
            client.close()

    async def _serve(self, client: Conn) -> None:
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=HEAD_LIMIT)
        while True:
            try:
                # One deadline for the whole head, not each read: a byte every few seconds must
                # not hold a connection (and its slot) open for ever.
                async with asyncio.timeout(self.timeouts.head):
                    event = await next_event(conn, client, self.timeouts.head)
            except h11.RemoteProtocolError as exc:
                await send_refusal(conn, client, 400, f"malformed request: {exc}")
                self.blocked(Blocked(host="", port=0, method="", rules="request", reason=f"malformed request: {exc}"))
                return
            if not isinstance(event, h11.Request):
                return  # the client closed between requests
            method = event.method.decode("ascii", "replace")
            try:
                if method == "CONNECT":
                    await self._tunnel(conn, event, client)
                    return
                keep = await forward_request(self, conn, event, client)
            except RefusedRequest as refused:
                await send_refusal(conn, client, refused.status, refused.blocked.reason)
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

    async def dial(self, allowed: Allowed) -> Conn:
        try:
            return await self.dialer.connect(allowed.host, allowed.port)
        except Refused as exc:
            raise RefusedRequest(
                403 if exc.rules == "address" else 400,
                Blocked(allowed.host, allowed.port, allowed.method, exc.rules, exc.reason),
            ) from None

    async def _tunnel(self, conn: h11.Connection, request: h11.Request, client: Conn) -> None:
        target = request.target.decode("ascii", "replace")
        split = split_authority(target)
        if split is None or split[1] is None:
            raise RefusedRequest(400, Blocked(target[:200], 0, "CONNECT", "request", "CONNECT needs host:port"))
        host, port = split[0], split[1]
        check_host_header(request, host, port, port, "CONNECT")
        rule = self.rules.allows_connect(host, port)
        allowed = await self.check_target("CONNECT", host, port, rule.text if rule else None)
        try:
            upstream = await self.dial(allowed)
        except Unreachable as exc:
            await send_refusal(conn, client, 504 if exc.timeout else 502, str(exc))
            return
        counted = False

        async def opening() -> bytes:
            nonlocal counted
            early, _closed = conn.trailing_data  # bytes the client sent after the request head
            first = await self._checked_opening(client, host, port, early)
            counted = True
            self.allowed(allowed)
            return first

        try:
            await send(client, conn, h11.Response(status_code=200, headers=[], reason=b"Connection Established"))
            await tunnel(client, upstream, self.timeouts.idle, opening=opening)
        finally:
            upstream.close()
        if not counted:
            self.allowed(allowed)  # the client sent nothing: still a connection made

    async def _checked_opening(self, client: Conn, host: str, port: int, early: bytes) -> bytes:
        """The tunnel's first client bytes, held back until checked: a TLS ClientHello that names
        the CONNECT host (or no host), see tls.py. Anything else is refused: plain HTTP in a tunnel
        would reach whatever site its Host header names behind the allowed host's front end (a CDN
        routes by Host), unchecked; plain HTTP goes to the proxy as a request, where Host is checked."""
        data = early or await client.recv(size=HELLO_LIMIT)  # the tunnel's idle timeout applies
        if not data:
            return data  # the client closed without a byte: nothing to pass on
        if not is_tls_handshake(data):
            why = (
                "a tunnel carries TLS only (its first bytes are not a TLS ClientHello): send plain HTTP "
                "to the proxy as a request"
            )
            raise RefusedRequest(403, Blocked(host, port, "CONNECT", "request", why))
        try:
            # Like a request head: the whole hello within one deadline.
            async with asyncio.timeout(self.timeouts.head):
                while (hello := read_client_hello(data)) is None:
                    more = await client.recv(size=HELLO_LIMIT)
                    if not more:
                        raise MalformedHello("the client closed in the middle of its ClientHello")
                    data += more
        except MalformedHello as exc:
            raise RefusedRequest(
                400, Blocked(host, port, "CONNECT", "request", f"a malformed TLS ClientHello: {exc}")
            ) from None
        if hello.encrypted:
            why = "the TLS ClientHello hides the server it asks for (encrypted_client_hello): it cannot be checked"
            raise RefusedRequest(400, Blocked(host, port, "CONNECT", "request", why))
        if hello.server_name is not None and normalize_host(hello.server_name) != host:
            why = (
                f"the TLS ClientHello asks for {hello.server_name[:100]!r} (SNI), not the CONNECT host {host}: "
                "a tunnel reaches only the host it was allowed for"
            )
            raise RefusedRequest(403, Blocked(host, port, "CONNECT", "allow-list", why))
        return data
