"""The git pkt-line format, the receive-pack command list, and git-native refusals.

A push request body is ``[shallow lines] command-list flush-pkt [pack]``. ``read_command_section``
takes the command list off the front of the streamed body (bounded), ``parse_receive_pack_commands``
decodes it, and the rest of the stream (the pack) is left untouched for ``git receive-pack``.
``rejection_response`` builds the answer receive-pack itself would give for refused refs, so the
git client prints ``! [remote rejected] main -> main (protected branch: force-push refused)``.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterable, Sequence

from forge.git.errors import GitProtocolError
from forge.git.refrules import RefUpdate

FLUSH_PKT = b"0000"
DELIM_PKT = b"0001"
RESPONSE_END_PKT = b"0002"
MAX_PKT_LEN = 65520
MAX_PKT_DATA = MAX_PKT_LEN - 4
DEFAULT_MAX_COMMAND_BYTES = 4 * 1024 * 1024

_HEX_OID = re.compile(rb"[0-9a-f]{40}|[0-9a-f]{64}", re.ASCII)
_HEX4 = re.compile(rb"[0-9a-fA-F]{4}", re.ASCII)


def pkt_line(data: bytes | str) -> bytes:
    """One pkt-line carrying ``data``."""
    payload = data.encode() if isinstance(data, str) else data
    if len(payload) > MAX_PKT_DATA:
        raise ValueError("pkt-line payload too long")
    return f"{len(payload) + 4:04x}".encode() + payload


def iter_pkt_lines(data: bytes) -> Iterable[bytes | None]:
    """Decode a complete buffer of pkt-lines: payloads, ``None`` for a flush-pkt."""
    pos = 0
    while pos < len(data):
        length = _pkt_length(data[pos : pos + 4])
        if length in (0, 1, 2):
            pos += 4
            yield None if length == 0 else b""
            continue
        if pos + length > len(data):
            raise GitProtocolError("truncated pkt-line")
        yield data[pos + 4 : pos + length]
        pos += length


def _pkt_length(header: bytes) -> int:
    if len(header) < 4:
        raise GitProtocolError("truncated pkt-line header")
    if not _HEX4.fullmatch(header):
        raise GitProtocolError("malformed pkt-line header")
    length = int(header, 16)
    if length == 3 or length > MAX_PKT_LEN:
        raise GitProtocolError("malformed pkt-line header")
    return length


def _section_end(buf: bytes | bytearray) -> int | None:
    """The offset just after the first flush-pkt in ``buf``, ``None`` if more bytes are needed."""
    pos = 0
    while pos + 4 <= len(buf):
        length = _pkt_length(bytes(buf[pos : pos + 4]))
        if length == 0:
            return pos + 4
        if length in (1, 2):
            raise GitProtocolError("unexpected delimiter in the push command list")
        pos += length
    return None


async def prepend(first: bytes, rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    if first:
        yield first
    async for chunk in rest:
        yield chunk


async def read_command_section(
    body: AsyncIterator[bytes], *, max_bytes: int = DEFAULT_MAX_COMMAND_BYTES
) -> tuple[bytes, AsyncIterator[bytes]]:
    """Read the command list (up to and including its flush-pkt) off the front of a push body.

    Returns the section's bytes and an iterator over the rest of the body (beginning with what
    was read past the section). An empty body gives an empty section.
    """
    buf = bytearray()
    async for chunk in body:
        buf += chunk
        end = _section_end(buf)
        if end is not None:
            return bytes(buf[:end]), prepend(bytes(buf[end:]), body)
        if len(buf) > max_bytes:
            raise GitProtocolError("push command list too large")
    if buf:
        raise GitProtocolError("push body ends inside the command list")
    return b"", prepend(b"", body)


def parse_receive_pack_commands(section: bytes) -> tuple[list[RefUpdate], list[str]]:
    """Decode a receive-pack command list: the ref updates and the client's capabilities."""
    updates: list[RefUpdate] = []
    capabilities: list[str] = []
    first = True
    seen_flush = False
    for payload in iter_pkt_lines(section):
        if payload is None:
            seen_flush = True
            break
        line = payload[:-1] if payload.endswith(b"\n") else payload
        if line.startswith(b"shallow "):
            if not first or not _HEX_OID.fullmatch(line[8:]):
                raise GitProtocolError("malformed shallow line")
            continue
        if line.startswith(b"push-cert"):
            raise GitProtocolError("signed pushes are not supported")
        if first:
            line, _, caps = line.partition(b"\0")
            capabilities = caps.decode("ascii", "replace").split()
            first = False
        parts = line.split(b" ")
        if len(parts) != 3 or not _HEX_OID.fullmatch(parts[0]) or not _HEX_OID.fullmatch(parts[1]):
            raise GitProtocolError("malformed push command")
        if len(parts[0]) != len(parts[1]):
            raise GitProtocolError("malformed push command")
        try:
            ref = parts[2].decode("utf-8")
        except UnicodeDecodeError:
            raise GitProtocolError("ref name is not valid UTF-8") from None
        updates.append(RefUpdate(old=parts[0].decode(), new=parts[1].decode(), ref=ref))
    if section and not seen_flush:
        raise GitProtocolError("push command list without its flush-pkt")
    return updates, capabilities


def _sideband(band: int, data: bytes, max_data: int) -> bytes:
    out = bytearray()
    for pos in range(0, len(data), max_data):
        out += pkt_line(bytes([band]) + data[pos : pos + max_data])
    return bytes(out)


def _clean(reason: str) -> str:
    return " ".join(reason.split()) or "refused"


def rejection_response(
    updates: Sequence[RefUpdate],
    reasons: dict[str, str],
    capabilities: Sequence[str],
    *,
    message: str | None = None,
    default_reason: str = "push refused: another ref in this push was refused",
) -> bytes:
    """The receive-pack response that refuses every ref of a push.

    ``reasons`` maps a ref to why it was refused; the other refs of the push get
    ``default_reason`` (a push is all or nothing). ``message`` lines go to the client's terminal
    as ``remote: ...`` when the client speaks side-band.
    """
    caps = set(capabilities)
    report = bytearray()
    if "report-status" in caps or "report-status-v2" in caps:
        report += pkt_line("unpack ok\n")
        for update in updates:
            reason = _clean(reasons.get(update.ref, default_reason))
            report += pkt_line(f"ng {update.ref} {reason}\n")
        report += FLUSH_PKT
    if "side-band-64k" in caps or "side-band" in caps:
        max_data = (MAX_PKT_DATA if "side-band-64k" in caps else 1000 - 4) - 1
        out = bytearray()
        if message:
            text = "".join(f"{line}\n" for line in message.splitlines())
            out += _sideband(2, text.encode(), max_data)
        out += _sideband(1, bytes(report), max_data)
        out += FLUSH_PKT
        return bytes(out)
    return bytes(report)
