"""The server name a tunnel's TLS ClientHello asks for (SNI, RFC 6066 section 3), read from the
first bytes a client sends through a CONNECT tunnel.

A shared front end (a CDN) routes a TLS connection by that name, not by the address it arrived
at: a tunnel to an allowed `host:443` whose hello names another host would reach that other
host behind the same front end (domain fronting). The proxy holds the hello back until this has
read it and refuses a name other than the CONNECT host.

Defensive and bounded: records may arrive split across reads and a hello may span records; at
most `HELLO_LIMIT` bytes are read; anything that is not a well-formed ClientHello once it began
as a TLS handshake is malformed (refused), never skipped. Only the fields up to the extensions are
walked, each length checked against what holds it.
"""

from dataclasses import dataclass

HELLO_LIMIT = 16 * 1024  # record headers included; a post-quantum hello is about 2 KiB
_HANDSHAKE = 22  # TLS record content type
_CLIENT_HELLO = 1  # handshake message type
_SERVER_NAME = 0  # extension type
_ENCRYPTED_CLIENT_HELLO = 0xFE0D  # extension type (ECH)
_HOST_NAME = 0  # server name type
_MAX_RECORD = 1 << 14


class MalformedHello(Exception):
    """The bytes began as a TLS handshake but are not a well-formed ClientHello within the limit."""


@dataclass(frozen=True)
class ClientHello:
    server_name: str | None  # as sent (ASCII), None when the hello names none
    encrypted: bool  # carries an encrypted_client_hello extension: the real name is hidden


def is_tls_handshake(first: bytes) -> bool:
    """Whether a tunnel's first bytes start a TLS handshake record (anything else is not TLS)."""
    return bool(first) and first[0] == _HANDSHAKE


def read_client_hello(data: bytes) -> ClientHello | None:
    """The ClientHello at the start of `data`, or None when more bytes are needed.

    MalformedHello when the bytes cannot be one, or when it would take more than HELLO_LIMIT."""
    message = bytearray()
    pos = 0
    while True:
        if len(data) - pos < 5:
            if len(data) >= HELLO_LIMIT:
                raise MalformedHello(f"the ClientHello is longer than {HELLO_LIMIT} bytes")
            return None
        kind, major, minor, length = data[pos], data[pos + 1], data[pos + 2], _u16(data, pos + 3)
        if kind != _HANDSHAKE:
            raise MalformedHello("a record that is not a handshake came before the ClientHello ended")
        if major != 3 or minor > 4:
            raise MalformedHello(f"the record version {major}.{minor} is not TLS")
        if not 0 < length <= _MAX_RECORD:
            raise MalformedHello(f"a handshake record of {length} bytes")
        if pos + 5 + length > len(data):
            if pos + 5 + length > HELLO_LIMIT:
                raise MalformedHello(f"the ClientHello is longer than {HELLO_LIMIT} bytes")
            return None
        message += data[pos + 5 : pos + 5 + length]
        pos += 5 + length
        if len(message) >= 4:
            if message[0] != _CLIENT_HELLO:
                raise MalformedHello(f"the first handshake message is of type {message[0]}, not a ClientHello")
            size = int.from_bytes(message[1:4], "big")
            if pos + (4 + size - len(message)) > HELLO_LIMIT:
                raise MalformedHello(f"the ClientHello is longer than {HELLO_LIMIT} bytes")
            if len(message) >= 4 + size:
                return _client_hello(bytes(message[4 : 4 + size]))


class _Reader:
    """Length-checked reads from one structure; MalformedHello past its end."""

    def __init__(self, data: bytes, what: str) -> None:
        self.data, self.pos, self.what = data, 0, what

    def take(self, n: int) -> bytes:
        if n > len(self.data) - self.pos:
            raise MalformedHello(f"the ClientHello's {self.what} ends early")
        chunk = self.data[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def u8(self) -> int:
        return self.take(1)[0]

    def u16(self) -> int:
        return int.from_bytes(self.take(2), "big")

    def vector(self, length_bytes: int, what: str) -> "_Reader":
        size = self.u8() if length_bytes == 1 else self.u16()
        return _Reader(self.take(size), what)

    @property
    def left(self) -> int:
        return len(self.data) - self.pos


def _client_hello(body: bytes) -> ClientHello:
    hello = _Reader(body, "body")
    hello.take(2 + 32)  # legacy_version, random
    if hello.vector(1, "session id").left > 32:
        raise MalformedHello("the ClientHello's session id is longer than 32 bytes")
    suites = hello.vector(2, "cipher suites").left
    if suites < 2 or suites % 2:
        raise MalformedHello("the ClientHello's cipher suites are not a list of pairs")
    if not hello.vector(1, "compression methods").left:
        raise MalformedHello("the ClientHello has no compression method")
    if not hello.left:
        return ClientHello(server_name=None, encrypted=False)  # no extensions at all (old clients)
    extensions = hello.vector(2, "extensions")
    if hello.left:
        raise MalformedHello("bytes follow the ClientHello's extensions")
    seen: set[int] = set()
    name: str | None = None
    while extensions.left:
        kind = extensions.u16()
        data = extensions.vector(2, "extension")
        if kind in seen:
            raise MalformedHello(f"the ClientHello repeats extension {kind}")
        seen.add(kind)
        if kind == _SERVER_NAME:
            name = _server_name(data)
    return ClientHello(server_name=name, encrypted=_ENCRYPTED_CLIENT_HELLO in seen)


def _server_name(ext: _Reader) -> str:
    names = ext.vector(2, "server name list")
    if ext.left or not names.left:
        raise MalformedHello("the ClientHello's server_name extension is malformed")
    found: list[bytes] = []
    while names.left:
        kind = names.u8()
        value = names.vector(2, "server name").data
        if kind == _HOST_NAME:
            found.append(value)
    if len(found) != 1:
        raise MalformedHello(f"the ClientHello names {len(found)} host names (one is allowed)")
    [raw] = found
    if not raw or len(raw) > 255 or not raw.isascii() or any(b <= 0x20 or b == 0x7F for b in raw):
        raise MalformedHello("the ClientHello's server name is not a host name")
    return raw.decode("ascii")


def _u16(data: bytes, pos: int) -> int:
    return int.from_bytes(data[pos : pos + 2], "big")
