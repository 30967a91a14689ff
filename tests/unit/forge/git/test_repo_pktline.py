import gzip
import os
from collections.abc import AsyncIterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from forge.git.errors import GitProtocolError, PushTooLarge, UnsupportedEncoding
from forge.git.pktline import (
    FLUSH_PKT,
    iter_pkt_lines,
    parse_receive_pack_commands,
    pkt_line,
    read_command_section,
    rejection_response,
)
from forge.git.refrules import RefUpdate
from forge.git.smart_http import (
    advertisement_content_type,
    decode_request_body,
    gunzip_stream,
    limit_stream,
    validate_git_protocol_header,
)

Z = "0" * 40
A = "a" * 40
B = "b" * 40


async def chunks(data: bytes, size: int) -> AsyncIterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]


async def collect(it: AsyncIterator[bytes]) -> bytes:
    out = bytearray()
    async for chunk in it:
        out += chunk
    return bytes(out)


def command_list(*lines: str, caps: str = "report-status side-band-64k agent=git/2.39") -> bytes:
    out = bytearray()
    for i, line in enumerate(lines):
        payload = line + ("\0" + caps if i == 0 else "") + "\n"
        out += pkt_line(payload)
    return bytes(out + FLUSH_PKT)


def test_pkt_line_round_trip() -> None:
    data = pkt_line("hello\n") + FLUSH_PKT + pkt_line(b"x")
    assert data[:4] == b"000a"
    assert list(iter_pkt_lines(data)) == [b"hello\n", None, b"x"]


def test_parse_commands() -> None:
    section = command_list(f"{A} {B} refs/heads/main", f"{Z} {B} refs/heads/new", f"{A} {Z} refs/tags/old")
    updates, caps = parse_receive_pack_commands(section)
    assert updates == [
        RefUpdate(old=A, new=B, ref="refs/heads/main"),
        RefUpdate(old=Z, new=B, ref="refs/heads/new"),
        RefUpdate(old=A, new=Z, ref="refs/tags/old"),
    ]
    assert caps == ["report-status", "side-band-64k", "agent=git/2.39"]
    assert updates[1].is_create and updates[2].is_delete


def test_parse_commands_with_shallow_lines() -> None:
    section = pkt_line(f"shallow {A}\n") + command_list(f"{A} {B} refs/heads/main")
    updates, _ = parse_receive_pack_commands(section)
    assert [u.ref for u in updates] == ["refs/heads/main"]


def test_parse_empty_command_list() -> None:
    assert parse_receive_pack_commands(FLUSH_PKT) == ([], [])
    assert parse_receive_pack_commands(b"") == ([], [])


@pytest.mark.parametrize(
    "section",
    [
        pkt_line(f"{A} {B}\n") + FLUSH_PKT,
        pkt_line(f"{A[:-1]}x {B} refs/heads/x\n") + FLUSH_PKT,
        pkt_line(f"{A} {B} refs/heads/x\n"),  # no flush
        b"zzzz",
        b"0003",
        pkt_line(f"{A} {'b' * 64} refs/heads/x\n") + FLUSH_PKT,
        pkt_line(b"push-cert\0caps\n") + FLUSH_PKT,
        pkt_line(f"{A} {B} ".encode() + b"refs/heads/\xff\n") + FLUSH_PKT,
        b"00ff" + b"x" * 10,
    ],
)
def test_malformed_command_lists(section: bytes) -> None:
    with pytest.raises(GitProtocolError):
        parse_receive_pack_commands(section)


@pytest.mark.parametrize("size", [1, 3, 7, 64, 100000])
async def test_read_command_section_keeps_the_rest(size: int) -> None:
    section = command_list(f"{A} {B} refs/heads/main")
    pack = b"PACK" + os.urandom(5000)
    got, rest = await read_command_section(chunks(section + pack, size))
    assert got == section
    assert await collect(rest) == pack


async def test_read_command_section_is_bounded() -> None:
    huge = b"".join(pkt_line(f"{A} {B} refs/heads/b{i}\n") for i in range(2000))
    with pytest.raises(GitProtocolError, match="too large"):
        await read_command_section(chunks(huge, 1000), max_bytes=10_000)


async def test_read_command_section_truncated_body() -> None:
    with pytest.raises(GitProtocolError):
        await read_command_section(chunks(pkt_line(f"{A} {B} refs/heads/main\n"), 10))
    section, rest = await read_command_section(chunks(b"", 10))
    assert section == b"" and await collect(rest) == b""


@given(st.binary(max_size=300), st.integers(min_value=1, max_value=50))
async def test_parser_never_crashes_on_garbage(data: bytes, size: int) -> None:
    try:
        section, _rest = await read_command_section(chunks(data, size), max_bytes=1000)
        parse_receive_pack_commands(section)
    except GitProtocolError:
        pass


def _demux(body: bytes) -> tuple[bytes, bytes]:
    band1, band2 = bytearray(), bytearray()
    for payload in iter_pkt_lines(body):
        if payload is None:
            continue
        (band1 if payload[0] == 1 else band2).extend(payload[1:])
    return bytes(band1), bytes(band2)


def test_rejection_with_sideband() -> None:
    updates = [RefUpdate(old=A, new=B, ref="refs/heads/main"), RefUpdate(old=Z, new=B, ref="refs/heads/ok")]
    body = rejection_response(
        updates,
        {"refs/heads/main": "protected branch: force-push refused"},
        ["report-status", "side-band-64k"],
        message="forgehand: nope",
    )
    assert body.endswith(FLUSH_PKT)
    report, message = _demux(body)
    assert message == b"forgehand: nope\n"
    assert list(iter_pkt_lines(report)) == [
        b"unpack ok\n",
        b"ng refs/heads/main protected branch: force-push refused\n",
        b"ng refs/heads/ok push refused: another ref in this push was refused\n",
        None,
    ]


def test_rejection_without_sideband() -> None:
    updates = [RefUpdate(old=A, new=Z, ref="refs/heads/main")]
    body = rejection_response(updates, {"refs/heads/main": "no\nnewlines"}, ["report-status"])
    assert list(iter_pkt_lines(body)) == [b"unpack ok\n", b"ng refs/heads/main no newlines\n", None]
    assert rejection_response(updates, {}, []) == b""


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("version=2", "version=2"),
        ("version=1", "version=1"),
        ("version=0", "version=0"),
        ("  version=2 ", "version=2"),
        ("foo=bar:version=2", "version=2"),
        ("version=3", None),
        ("version=2;rm -rf", None),
        ("version=2\nX: y", None),
        ("version=2:", None),
        ("", None),
        (None, None),
        ("v" * 300, None),
        ("version=2:" * 20, None),
        ("version=2 version=1", None),
        ("version=$(id)", None),
    ],
)
def test_git_protocol_header(header: str | None, expected: str | None) -> None:
    assert validate_git_protocol_header(header) == expected


@given(st.text(max_size=300))
def test_git_protocol_header_is_strict(header: str) -> None:
    assert validate_git_protocol_header(header) in (None, "version=0", "version=1", "version=2")


@pytest.mark.parametrize("size", [1, 17, 4096])
async def test_gunzip_stream(size: int) -> None:
    data = os.urandom(20000) + b"a" * 200000
    out = await collect(gunzip_stream(chunks(gzip.compress(data), size), max_bytes=10**6))
    assert out == data


async def test_gunzip_stream_caps_bombs() -> None:
    bomb = gzip.compress(b"\0" * 50_000_000)
    assert len(bomb) < 100_000
    with pytest.raises(PushTooLarge):
        await collect(gunzip_stream(chunks(bomb, 4096), max_bytes=1_000_000))


async def test_gunzip_stream_rejects_garbage_and_truncation() -> None:
    with pytest.raises(UnsupportedEncoding):
        await collect(gunzip_stream(chunks(b"not gzip at all", 4), max_bytes=1000))
    with pytest.raises(UnsupportedEncoding):
        await collect(gunzip_stream(chunks(gzip.compress(b"x" * 1000)[:-12], 4), max_bytes=10000))


async def test_decode_request_body() -> None:
    data = b"0000"
    assert await collect(decode_request_body(chunks(gzip.compress(data), 3), "gzip", max_bytes=10)) == data
    assert await collect(decode_request_body(chunks(data, 3), None, max_bytes=10)) == data
    with pytest.raises(PushTooLarge):
        await collect(decode_request_body(chunks(b"x" * 11, 3), "identity", max_bytes=10))
    with pytest.raises(UnsupportedEncoding):
        decode_request_body(chunks(data, 3), "br", max_bytes=10)


async def test_limit_stream() -> None:
    assert await collect(limit_stream(chunks(b"x" * 10, 3), 10)) == b"x" * 10
    with pytest.raises(PushTooLarge):
        await collect(limit_stream(chunks(b"x" * 11, 3), 10))


def test_content_types() -> None:
    assert advertisement_content_type("git-upload-pack") == "application/x-git-upload-pack-advertisement"
    with pytest.raises(ValueError):
        advertisement_content_type("git-upload-archive")
