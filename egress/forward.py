"""Plain HTTP through the proxy: an absolute-form request (`GET http://host/path HTTP/1.1`) is
checked (http only, no userinfo, one Host header naming the URL's host, a rule for its method and
path), sent upstream in origin-form on a connection of its own (closed after the answer), and the
answer streamed back. Bodies are streamed, never held whole: an answer of known length goes socket
to socket (pump.py), a chunked or close-delimited one and every request body chunk by chunk
through h11."""

from typing import Protocol, cast
from urllib.parse import urlsplit

import h11

from egress.addresses import Unreachable
from egress.http11 import (
    Allowed,
    Blocked,
    RefusedRequest,
    Timeouts,
    check_framing,
    check_host_header,
    end_to_end,
    next_event,
    send,
    send_refusal,
)
from egress.pump import transfer
from egress.rules import RuleSet, split_authority
from egress.sockio import Conn


class Gate(Protocol):
    """The proxy as this module uses it."""

    rules: RuleSet
    timeouts: Timeouts

    async def check_target(self, method: str, host: str, port: int, allowed_by: str | None) -> Allowed: ...

    async def dial(self, allowed: Allowed) -> Conn: ...

    def allowed(self, allowed: Allowed) -> None: ...


def parse_target(request: h11.Request, method: str) -> tuple[str, int, str, str]:
    """(host, port, path, origin-form target) of an absolute-form http:// request, or why not."""
    target = request.target.decode("ascii", "replace")
    if not target.lower().startswith("http://"):
        if target.lower().startswith("https://"):
            why = "https:// goes through CONNECT (set HTTPS_PROXY), not as a request to the proxy"
        else:
            why = "this is a proxy: send the absolute URL (GET http://host/path) or CONNECT host:port"
        raise RefusedRequest(400, Blocked("", 0, method, "request", why))
    try:
        parts = urlsplit(target)
    except ValueError:
        raise RefusedRequest(400, Blocked("", 0, method, "request", "the request URL cannot be parsed")) from None
    if "@" in parts.netloc:
        raise RefusedRequest(400, Blocked("", 0, method, "request", "the request URL carries userinfo"))
    split = split_authority(parts.netloc)
    if split is None:
        why = "the request URL has no valid host"
        raise RefusedRequest(400, Blocked(parts.netloc[:200], 0, method, "request", why))
    host, port = split[0], split[1] or 80
    path = parts.path or "/"
    origin = path + (f"?{parts.query}" if parts.query else "")
    return host, port, path, origin


async def forward_request(gate: Gate, conn: h11.Connection, request: h11.Request, client: Conn) -> bool:
    """Forward one request and its answer; True when the client's connection may carry another."""
    method = request.method.decode("ascii", "replace")
    host, port, path, origin = parse_target(request, method)
    check_host_header(request, host, port, 80, method)
    check_framing(request, host, port, method)
    rule = gate.rules.allows_request(method, host, port, path)
    allowed = await gate.check_target(method, host, port, rule.text if rule else None)
    try:
        upstream = await gate.dial(allowed)
    except Unreachable as exc:
        await send_refusal(conn, client, 504 if exc.timeout else 502, str(exc))
        return False
    gate.allowed(allowed)
    idle = gate.timeouts.idle
    try:
        up = h11.Connection(h11.CLIENT)
        headers = end_to_end(list(request.headers))
        if any(k == b"transfer-encoding" for k, _ in request.headers):
            # h11 only accepts chunked: keep the framing, and never a length beside it.
            headers = [(k, v) for k, v in headers if k != b"content-length"]
            headers.append((b"transfer-encoding", b"chunked"))
        headers.append((b"connection", b"close"))
        if not any(k == b"host" for k, _ in headers):
            headers.insert(0, (b"host", _authority(host, port)))
        await send(upstream, up, h11.Request(method=request.method, target=origin.encode(), headers=headers))
        if conn.client_is_waiting_for_100_continue:
            await send(client, conn, h11.InformationalResponse(status_code=100, headers=[]))
        if not await _relay_body(conn, client, up, upstream, idle):
            return False  # the client went away mid-body
        return await _answer(conn, up, upstream, client, idle, head_only=method == "HEAD")
    except (h11.RemoteProtocolError, h11.LocalProtocolError, TimeoutError):
        if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
            await send_refusal(conn, client, 502, f"{host}:{port} sent no valid answer in time")
        return False
    finally:
        upstream.close()


async def _answer(
    conn: h11.Connection, up: h11.Connection, upstream: Conn, client: Conn, idle: float, *, head_only: bool
) -> bool:
    """Stream the upstream answer to the client (1xx answers are the proxy's business, dropped)."""
    while True:
        event = await next_event(up, upstream, idle)
        if isinstance(event, h11.InformationalResponse):
            continue
        if not isinstance(event, h11.Response):
            return False
        headers = end_to_end(list(event.headers))
        await send(client, conn, h11.Response(status_code=event.status_code, headers=headers, reason=event.reason))
        break
    length = _content_length(event) if not head_only and event.status_code not in (204, 304) else None
    if length is not None:
        return await _copy_body(conn, up, upstream, client, length, idle)
    # A chunked or close-delimited answer; if the upstream closes mid-answer, the client's
    # connection ends too.
    return await _relay_body(up, upstream, conn, client, idle)


async def _relay_body(src: h11.Connection, src_sock: Conn, dst: h11.Connection, dst_sock: Conn, idle: float) -> bool:
    """One message body, chunk by chunk, re-framed by h11; False when the sender went away first."""
    while True:
        event = await next_event(src, src_sock, idle)
        if isinstance(event, h11.Data):
            await send(dst_sock, dst, h11.Data(data=event.data))
        elif isinstance(event, h11.EndOfMessage):
            await send(dst_sock, dst, h11.EndOfMessage())
            return True
        else:
            return False


async def _copy_body(
    conn: h11.Connection, up: h11.Connection, upstream: Conn, client: Conn, length: int, idle: float
) -> bool:
    """A body of known length: what h11 already holds, then straight from socket to socket (h11
    still frames and counts what the client gets; the upstream connection ends after it)."""
    left = length
    while left:
        event = up.next_event()
        if not isinstance(event, h11.Data):
            break
        left -= len(event.data)
        await send(client, conn, h11.Data(data=event.data))
    if left:
        # h11 counts the rest without seeing it (with a Content-Length it writes nothing but the
        # part itself, which is not sent): the bytes go socket to socket.
        conn.send_with_data_passthrough(h11.Data(data=cast(bytes, _Unseen(left))))
        if await transfer(upstream, client, left, idle) < left:
            return False  # the upstream closed mid-answer: the client's connection ends too
    await send(client, conn, h11.EndOfMessage())
    return True


class _Unseen:
    """A body part h11 counts but never holds: it only takes `len()` of what it passes through."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size


def _content_length(response: h11.Response) -> int | None:
    values = [v for k, v in response.headers if k == b"content-length"]
    if len(values) != 1 or any(k == b"transfer-encoding" for k, _ in response.headers):
        return None
    return int(values[0]) if values[0].isdigit() else None


def _authority(host: str, port: int) -> bytes:
    shown = f"[{host}]" if ":" in host else host
    return (shown if port == 80 else f"{shown}:{port}").encode()
