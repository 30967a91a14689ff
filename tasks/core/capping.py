"""Output caps: a tool's or a stream's text kept to its first and last bytes, with a count of
what was left out between them."""

TOOL_OUTPUT_CAP = 64 * 1024


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
