"""The spawn line splitter: lines across chunk borders, the per-line cap, the unterminated last line."""

import gc

from sandbox.process import CutLine, LineSplitter, truncated


def feed_all(chunks: list[bytes], cap: int) -> list[tuple[bytes, bool, int]]:
    splitter = LineSplitter(cap)
    out = [line for chunk in chunks for line in splitter.feed(chunk)]
    last = splitter.flush()
    if last is not None:
        out.append(last)
    return [(bytes(line), truncated(line), _dropped(line)) for line in out]


def _dropped(line: bytes) -> int:
    return line.dropped if isinstance(line, CutLine) else 0


def test_lines_split_across_chunks_at_every_offset() -> None:
    data = b'{"a": 1}\n\n{"b": 2}\nlast'
    for size in range(1, len(data) + 1):
        chunks = [data[i : i + size] for i in range(0, len(data), size)]
        assert feed_all(chunks, 100) == [
            (b'{"a": 1}', False, 0),
            (b"", False, 0),
            (b'{"b": 2}', False, 0),
            (b"last", False, 0),
        ]


def test_an_oversize_line_is_cut_at_the_cap_and_the_rest_counted() -> None:
    chunks = [b"abc", b"defgh", b"ij\nok\n", b"0123456789"]
    assert feed_all(chunks, 4) == [(b"abcd", True, 6), (b"ok", False, 0), (b"0123", True, 6)]


def test_a_line_exactly_at_the_cap_is_whole() -> None:
    assert feed_all([b"abcd\n"], 4) == [(b"abcd", False, 0)]
    assert feed_all([], 4) == []


def test_an_oversize_line_inside_one_chunk_is_cut_and_the_cut_lines_counted() -> None:
    splitter = LineSplitter(4)
    lines = splitter.feed(b"ab\n0123456789\ncd\nxyzxyz")
    assert [(bytes(line), truncated(line), _dropped(line)) for line in lines] == [
        (b"ab", False, 0),
        (b"0123", True, 6),
        (b"cd", False, 0),
    ]
    assert splitter.truncated == 1
    last = splitter.flush()
    assert last is not None and (bytes(last), truncated(last), _dropped(last)) == (b"xyzx", True, 2)
    assert splitter.truncated == 2


def test_whole_lines_are_plain_bytes_the_collector_does_not_track() -> None:
    """Thousands of lines a second sit in the queues: as a bytes subclass each would be tracked by
    the garbage collector (and bring its full collections sooner); only a cut line is one."""
    lines = LineSplitter(8).feed(b"short\n0123456789\n")
    assert type(lines[0]) is bytes and not gc.is_tracked(lines[0])
    assert isinstance(lines[1], CutLine)
