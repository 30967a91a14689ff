"""What the proxy's parts share: the reports (`Blocked`, `Allowed`), the timeouts, and the h11
helpers (read the next event, answer a refusal, check the Host header, drop hop-by-hop headers)."""

from dataclasses import dataclass
from http import HTTPStatus

import h11

from egress.rules import split_authority
from egress.sockio import Conn

HEAD_LIMIT = 64 * 1024  # request line and headers

# Headers that belong to one connection (RFC 9110 7.6.1), never passed on; plus the proxy's own.
HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"expect",
    }
)


@dataclass(frozen=True)
class Blocked:
    host: str
    port: int
    method: str
    rules: str  # the rule set that refused: "allow-list", "address", "request" or "limit"
    reason: str


@dataclass(frozen=True)
class Allowed:
    host: str
    port: int
    method: str
    rule: str  # the rule that allowed it, as written
    internal: bool = False  # the sandbox's own channel (a loopback relay), not egress: not counted


@dataclass(frozen=True)
class Timeouts:
    head: float = 30.0  # a request line and headers, from the first byte or the previous request
    idle: float = 300.0  # a tunnel, a body or an answer moving no byte in either direction


class RefusedRequest(Exception):
    def __init__(self, status: int, blocked: Blocked) -> None:
        super().__init__(blocked.reason)
        self.status = status
        self.blocked = blocked


def check_host_header(request: h11.Request, host: str, port: int, default_port: int, method: str) -> None:
    """At most one Host header, naming the target's host and port (`default_port` when it names
    none): a second host in the header is how a request is smuggled past a proxy's check."""
    values = [v.decode("latin-1") for k, v in request.headers if k == b"host"]
    if not values:
        return  # HTTP/1.0, or CONNECT: the target says it all (h11 refuses HTTP/1.1 without Host)
    if len(values) != 1:
        raise RefusedRequest(400, Blocked(host, port, method, "request", "the request has more than one Host header"))
    split = split_authority(values[0].strip())
    named = None if split is None else (split[0], split[1] or default_port)
    if named != (host, port):
        reason = f"the Host header ({values[0][:100]!r}) names another host than the request target ({host}:{port})"
        raise RefusedRequest(400, Blocked(host, port, method, "request", reason))


def check_framing(request: h11.Request, host: str, port: int, method: str) -> None:
    """One way to frame the body: a request with both Content-Length and Transfer-Encoding, or two
    Content-Lengths, is read one way by the proxy and maybe another by the server behind it (a
    second request smuggled past the rules)."""
    lengths = [v for k, v in request.headers if k == b"content-length"]
    chunked = any(k == b"transfer-encoding" for k, _ in request.headers)
    if len(lengths) > 1 or (lengths and chunked):
        reason = "the request frames its body twice (Content-Length with Transfer-Encoding, or two Content-Lengths)"
        raise RefusedRequest(400, Blocked(host, port, method, "request", reason))


async def next_event(conn: h11.Connection, sock: Conn, timeout: float) -> object:  # noqa: ASYNC109
    """The next h11 event, reading as needed; each read waits at most `timeout`."""
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(await sock.recv(timeout))
            continue
        return event


async def send(sock: Conn, conn: h11.Connection, event: h11.Event) -> None:
    """Send one event; a body chunk goes out as it is (h11 frames it without copying)."""
    pieces = conn.send_with_data_passthrough(event)
    for piece in pieces or ():
        await sock.sendall(piece)


async def send_refusal(conn: h11.Connection, sock: Conn, status: int, reason: str) -> None:
    """A short text answer that closes the connection (when the client can still be answered)."""
    if conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
        return
    body = f"forgehand egress: {reason}\n".encode()
    headers = [
        (b"content-type", b"text/plain; charset=utf-8"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
        (b"x-forgehand-egress", b"refused"),
    ]
    try:
        phrase = HTTPStatus(status).phrase.encode()
        await send(sock, conn, h11.Response(status_code=status, headers=headers, reason=phrase))
        await send(sock, conn, h11.Data(data=body))
        await send(sock, conn, h11.EndOfMessage())
    except (h11.LocalProtocolError, OSError):
        pass


def end_to_end(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The headers without hop-by-hop ones (and without those the Connection header names)."""
    named = {
        token.strip().lower() for k, v in headers if k == b"connection" for token in v.split(b",") if token.strip()
    }
    return [(k, v) for k, v in headers if k not in HOP_BY_HOP and k not in named]
