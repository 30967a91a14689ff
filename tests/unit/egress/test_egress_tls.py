"""The ClientHello reader behind the proxy's SNI check: real hellos (OpenSSL's, through Python's
ssl), hellos cut anywhere, and what a well-behaved client never sends."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from egress.tls import HELLO_LIMIT, ClientHello, MalformedHello, is_tls_handshake, read_client_hello
from tests.support.tls_hello import (
    as_records,
    built_hello,
    extension,
    handshake_message,
    real_client_hello,
    server_name_extension,
)

REAL = real_client_hello("allowed.test")


def test_a_real_hello_names_its_server() -> None:
    assert is_tls_handshake(REAL)
    assert read_client_hello(REAL) == ClientHello(server_name="allowed.test", encrypted=False)
    assert read_client_hello(real_client_hello(None)) == ClientHello(server_name=None, encrypted=False)


def test_every_prefix_asks_for_more_and_the_whole_is_read() -> None:
    for end in range(len(REAL)):
        assert read_client_hello(REAL[:end]) is None, end
    # What follows the hello (early data, the next record) is not the hello's business.
    assert read_client_hello(REAL + b"\x17\x03\x03\x00\x05hello") == read_client_hello(REAL)


@pytest.mark.parametrize("size", [1, 7, 100, 16384])
def test_a_hello_cut_into_many_records_is_read_whole(size: int) -> None:
    flight = as_records(handshake_message(REAL), size)
    assert read_client_hello(flight) == ClientHello(server_name="allowed.test", encrypted=False)


def test_not_tls_is_told_apart() -> None:
    assert not is_tls_handshake(b"GET / HTTP/1.1\r\n")
    assert not is_tls_handshake(b"SSH-2.0-OpenSSH_9.2\r\n")
    assert not is_tls_handshake(b"")


def test_without_extensions_and_with_ech() -> None:
    assert read_client_hello(as_records(built_hello(with_extensions=False), 1000)) == ClientHello(None, False)
    ech = built_hello(server_name_extension(b"allowed.test"), extension(0xFE0D, b"\x00" * 40))
    assert read_client_hello(as_records(ech, 1000)) == ClientHello("allowed.test", encrypted=True)


@pytest.mark.parametrize(
    ("flight", "why"),
    [
        (b"\x16\x03\x01\x00\x05\x02\x00\x00\x01\x00", "not a ClientHello"),
        (b"\x16\x02\x00\x00\x05" + b"\x01" * 5, "not TLS"),
        (b"\x16\x03\x01\x00\x00", "a handshake record of 0 bytes"),
        (b"\x16\x03\x01\x48\x01", "a handshake record of 18433 bytes"),
        (as_records(handshake_message(REAL)[:10], 10) + b"\x17\x03\x03\x00\x01x", "not a handshake"),
        (as_records(built_hello(server_name_extension(b"a.test", b"b.test")), 1000), "2 host names"),
        (as_records(built_hello(server_name_extension(b"a.test"), server_name_extension(b"b.test")), 1000), "repeats"),
        (as_records(built_hello(extension(0)), 1000), "extension ends early"),
        (as_records(built_hello(server_name_extension(b"")), 1000), "not a host name"),
        (as_records(built_hello(server_name_extension(b"a.test\x00.evil")), 1000), "not a host name"),
        (as_records(built_hello(server_name_extension(b"caf\xc3\xa9.test")), 1000), "not a host name"),
    ],
    ids=lambda value: value if isinstance(value, str) else "",
)
def test_malformed_hellos_are_refused(flight: bytes, why: str) -> None:
    with pytest.raises(MalformedHello, match=why):
        read_client_hello(flight)


def test_a_hello_longer_than_the_limit_is_refused_before_it_is_all_there() -> None:
    padding = extension(21, b"\x00" * (HELLO_LIMIT + 100))  # RFC 7685 padding, far too much of it
    flight = as_records(built_hello(server_name_extension(b"allowed.test"), padding), 16384)
    with pytest.raises(MalformedHello, match="longer than"):
        read_client_hello(flight[:16389])  # the first record, long before the rest arrives
    with pytest.raises(MalformedHello, match="longer than"):
        # A hello of 3 KB, but in records of one byte each: 18 KB on the wire.
        read_client_hello(as_records(built_hello(extension(21, b"\x00" * 3000)), 1))


def test_a_truncated_hello_inside_complete_records_is_malformed() -> None:
    message = handshake_message(REAL)
    cut = bytes([1]) + (len(message) - 4 - 30).to_bytes(3, "big") + message[4:-30]  # claims what it holds
    with pytest.raises(MalformedHello, match="ends early"):
        read_client_hello(as_records(cut, 1000))


@settings(max_examples=400, deadline=None)
@given(st.integers(min_value=0, max_value=len(REAL) - 1), st.integers(min_value=0, max_value=255))
def test_any_corrupted_byte_is_read_or_refused_never_crashes(at: int, value: int) -> None:
    corrupted = REAL[:at] + bytes([value]) + REAL[at + 1 :]
    try:
        hello = read_client_hello(corrupted)
    except MalformedHello:
        return
    assert hello is None or isinstance(hello, ClientHello)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=3000))
def test_random_bytes_after_a_handshake_byte_never_crash(tail: bytes) -> None:
    try:
        hello = read_client_hello(b"\x16" + tail)
    except MalformedHello:
        return
    assert hello is None or isinstance(hello, ClientHello)
