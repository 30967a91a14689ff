"""Output caps: a tool's or a stream's text kept to its first and last bytes, with a count of
what was left out between them; and a run's stream output kept to what its stored form may take."""

import msgspec

TOOL_OUTPUT_CAP = 64 * 1024
# A run's stdout and stderr as stored (the transcript's JSON), together.
STREAM_STORE_CAP = 16 * 1024 * 1024


class HeadTail:
    """Keeps the first and last `cap/2` bytes of a stream and counts what is in between."""

    def __init__(self, cap: int = TOOL_OUTPUT_CAP) -> None:
        self.half = cap // 2
        self.head = bytearray()
        self.tail = bytearray()
        self.omitted = 0

    def add(self, data: bytes) -> None:
        room = self.half - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if not data:
            return
        self.tail += data
        if len(self.tail) > self.half:
            drop = len(self.tail) - self.half
            self.omitted += drop
            del self.tail[:drop]

    def text(self) -> str:
        head = self.head.decode("utf-8", "replace")
        tail = self.tail.decode("utf-8", "replace")
        if self.omitted:
            return f"{head}\n[... {self.omitted} bytes omitted ...]\n{tail}"
        return head + tail


def cap_text(text: str, cap: int = TOOL_OUTPUT_CAP) -> tuple[str, int]:
    if len(text) <= cap - cap % 2 and text.isascii():  # fits as it is (one byte a character)
        return text, 0
    buf = HeadTail(cap)
    buf.add(text.encode("utf-8", "replace"))
    return buf.text(), buf.omitted


def stored_size(text: str) -> int:
    """The bytes `text` takes in the transcript's JSON: a byte that is not UTF-8 is read as U+FFFD
    (three bytes), a control byte as `\\u0001` (six): binary output stores about twice its size."""
    try:
        return len(msgspec.json.encode(text)) - 2
    except UnicodeEncodeError:  # lone surrogates: at most six bytes each, as escapes
        return 6 * len(text)


class StoredCap:
    """A run's stream output kept to `cap` bytes as stored (not as the program wrote it, which
    is what the sandbox's own cap counts): the first `cap` bytes are kept, what follows is counted
    (as UTF-8 bytes of its text) and left out."""

    def __init__(self, cap: int = STREAM_STORE_CAP) -> None:
        self.left = cap
        self.omitted = 0

    def take(self, text: str) -> tuple[str, int]:
        """The part of `text` to store, and how many bytes of it were left out."""
        if not text:
            return text, 0
        size = stored_size(text) if self.left > 0 else self.left + 1
        if size <= self.left:
            self.left -= size
            return text, 0
        keep = self._fitting(text) if self.left > 0 else 0
        self.left = 0
        dropped = len(text[keep:].encode("utf-8", "surrogatepass"))
        self.omitted += dropped
        return text[:keep], dropped

    def _fitting(self, text: str) -> int:
        """The longest prefix of `text` (in characters) that stores within what is left."""
        lo, hi = 0, min(len(text), self.left)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if stored_size(text[:mid]) <= self.left:
                lo = mid
            else:
                hi = mid - 1
        return lo
