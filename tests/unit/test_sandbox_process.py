"""The spawn line splitter: lines across chunk borders, the per-line cap, the unterminated last line."""

from sandbox.process import LineSplitter


def feed_all(chunks: list[bytes], cap: int) -> list[tuple[bytes, bool, int]]:
    splitter = LineSplitter(cap)
    out = [line for chunk in chunks for line in splitter.feed(chunk)]
    last = splitter.flush()
    if last is not None:
        out.append(last)
    return [(bytes(line), line.truncated, line.dropped) for line in out]


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
