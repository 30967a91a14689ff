"""TLS ClientHellos for the egress proxy's SNI check: a real one (Python's ssl, through memory
BIOs: what OpenSSL sends), and hand-built ones for what a well-behaved client never sends."""

import contextlib
import os
import ssl

HANDSHAKE = 22


def real_client_hello(server_name: str | None) -> bytes:
    """The first flight of a TLS client (one or more records holding its ClientHello)."""
    context = ssl.create_default_context()
    if server_name is None:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname=server_name)
    with contextlib.suppress(ssl.SSLWantReadError):  # it waits for the server's answer
        tls.do_handshake()
    return outgoing.read()


def handshake_message(first_flight: bytes) -> bytes:
    """The handshake bytes (type, length, body) inside a flight of handshake records."""
    out, pos = bytearray(), 0
    while pos < len(first_flight):
        length = int.from_bytes(first_flight[pos + 3 : pos + 5], "big")
        out += first_flight[pos + 5 : pos + 5 + length]
        pos += 5 + length
    return bytes(out)


def as_records(message: bytes, size: int) -> bytes:
    """A handshake message cut into records of at most `size` bytes (TLS allows any cut)."""
    return b"".join(
        bytes([HANDSHAKE, 3, 1]) + len(part).to_bytes(2, "big") + part
        for part in (message[i : i + size] for i in range(0, len(message), size))
    )


def _vector(data: bytes, length_bytes: int) -> bytes:
    return len(data).to_bytes(length_bytes, "big") + data


def server_name_extension(*names: bytes, name_type: int = 0) -> bytes:
    entries = b"".join(bytes([name_type]) + _vector(n, 2) for n in names)
    return (0).to_bytes(2, "big") + _vector(_vector(entries, 2), 2)


def extension(kind: int, data: bytes = b"") -> bytes:
    return kind.to_bytes(2, "big") + _vector(data, 2)


def built_hello(*extensions: bytes, with_extensions: bool = True) -> bytes:
    """A ClientHello handshake message (not yet in records) with exactly these extensions."""
    body = b"\x03\x03" + os.urandom(32) + _vector(b"", 1) + _vector(b"\x13\x01\xc0\x2f", 2) + _vector(b"\x00", 1)
    if with_extensions:
        body += _vector(b"".join(extensions), 2)
    return bytes([1]) + len(body).to_bytes(3, "big") + body
