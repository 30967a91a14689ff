"""Usage of one model call, read from the provider's answer as it passes (SSE events or JSON),
and its cost from the operator's optional price table (`FORGEHAND_MODEL_PRICES`).

Providers report output tokens only at the end of a stream; while it streams, output is
estimated from the deltas (about four characters a token), so a token budget can cut a stream
before its end. The final figure replaces the estimate when the provider sends it."""

import json
import math
import re
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

CHARS_PER_TOKEN = 4


class Usage(msgspec.Struct, kw_only=True):
    input_tokens: int = 0  # not counting the cache's tokens
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0

    @property
    def total(self) -> int:
        return self.input_tokens + self.output_tokens + self.cache_read_tokens + self.cache_write_tokens


class Price(msgspec.Struct, frozen=True, kw_only=True):
    """USD per million tokens."""

    input: float
    output: float
    cache_read: float | None = None  # absent: the input price
    cache_write: float | None = None

    def cost_micros(self, usage: Usage) -> int:
        """Micro-USD (a price per million tokens is exactly micro-USD per token)."""
        read = self.input if self.cache_read is None else self.cache_read
        write = self.input if self.cache_write is None else self.cache_write
        total = (
            usage.input_tokens * self.input
            + usage.output_tokens * self.output
            + usage.cache_read_tokens * read
            + usage.cache_write_tokens * write
        )
        return round(total)

    def not_above(self, other: "Price") -> bool:
        """No kind of token costs more at this price than at `other`."""
        mine = (self.input, self.output, self.cache_read, self.cache_write)
        theirs = (other.input, other.output, other.cache_read, other.cache_write)
        read = (self.input if mine[2] is None else mine[2], other.input if theirs[2] is None else theirs[2])
        write = (self.input if mine[3] is None else mine[3], other.input if theirs[3] is None else theirs[3])
        return mine[0] <= theirs[0] and mine[1] <= theirs[1] and read[0] <= read[1] and write[0] <= write[1]


class PriceTable(msgspec.Struct, frozen=True):
    prices: dict[str, Price]

    def find(self, model: str) -> Price | None:
        """The model's price: its exact name, else the longest `prefix*` entry it starts with."""
        if model in self.prices:
            return self.prices[model]
        best: tuple[int, Price] | None = None
        for name, price in self.prices.items():
            if name.endswith("*") and model.startswith(name[:-1]) and (best is None or len(name) > best[0]):
                best = (len(name), price)
        return best[1] if best else None

    def cost_micros(self, model: str, usage: Usage) -> int | None:
        price = self.find(model)
        return None if price is None else price.cost_micros(usage)


EMPTY_PRICES = PriceTable({})
_loaded: dict[tuple[str, float], PriceTable] = {}


def load_prices(path: str) -> PriceTable:
    """Read (and cache, until the file changes) a price table; ValueError names what is wrong."""
    if not path:
        return EMPTY_PRICES
    file = Path(path)
    try:
        key = (str(file), file.stat().st_mtime)
        if key in _loaded:
            return _loaded[key]
        raw = file.read_bytes()
    except OSError as exc:
        raise ValueError(f"FORGEHAND_MODEL_PRICES: cannot read {path}: {exc.strerror}") from None
    try:
        data: Any = tomllib.loads(raw.decode()) if file.suffix == ".toml" else json.loads(raw)
        table = PriceTable(msgspec.convert(data, dict[str, Price]))
    except (ValueError, UnicodeDecodeError, msgspec.ValidationError) as exc:
        raise ValueError(f"FORGEHAND_MODEL_PRICES: {path} is not a price table: {exc}") from None
    for name, price in table.prices.items():
        values = (price.input, price.output, price.cache_read or 0, price.cache_write or 0)
        if any(v < 0 or not math.isfinite(v) for v in values):
            raise ValueError(f"FORGEHAND_MODEL_PRICES: {path}: the prices of {name!r} must be finite and >= 0")
    _loaded[key] = table
    return table


class _Delta(msgspec.Struct):
    """A delta's fields that carry streamed text (a struct: decoded faster than a dict)."""

    text: Any = None
    partial_json: Any = None
    thinking: Any = None


class _AnthropicEvent(msgspec.Struct):
    """The fields of an Anthropic stream event the meter reads (the rest is skipped unread)."""

    type: Any = None
    message: Any = None
    usage: Any = None
    index: Any = None
    delta: _Delta | None = None
    error: Any = None


class _OpenAIEvent(msgspec.Struct):
    model: Any = None
    choices: Any = None
    usage: Any = None
    error: Any = None


# A blank line ends an SSE event (LF or CRLF line ends).
_EVENT_END = re.compile(rb"(?:\r?\n){2}")
# Anthropic events that carry usage, block bookkeeping or delta text; the others (ping,
# message_stop) pass undecoded.
_ANTHROPIC_READ = frozenset(
    b"message_start message_delta content_block_start content_block_stop content_block_delta error".split()
)


def nonneg(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def sse_data(frame: bytes) -> bytes:
    """An SSE event's data: its `data:` lines joined."""
    if frame.count(b"data:") == 1:  # the usual event: one data line
        i = frame.find(b"data:")
        end = frame.find(b"\n", i)
        return frame[i + 5 : end if end >= 0 else len(frame)].strip()
    return b"\n".join(line[5:].strip() for line in frame.splitlines() if line.startswith(b"data:"))


Stop = Callable[[], bool]


class Meter:
    """Reads one answer's usage. `feed` reads the body as it streams (SSE), the chunks as they
    come, and can stop it after any complete event; `finish_json` reads a whole JSON answer."""

    def __init__(self) -> None:
        self.usage = Usage()
        self.model = ""
        self.error = ""
        self.streamed_chars = 0
        self.final_output = False  # the provider's own output count arrived
        self._buffer = b""  # the stream's unfinished last event
        self.open_blocks: set[int] = set()  # Anthropic content blocks started and not yet stopped

    @property
    def input_known(self) -> bool:
        """The provider said what the input cost (Anthropic at the start, OpenAI only at the end)."""
        u = self.usage
        return bool(u.input_tokens or u.cache_read_tokens or u.cache_write_tokens)

    @property
    def estimated_total(self) -> int:
        """Tokens so far: what the provider said, or (before it says) estimated from the deltas."""
        output = self.usage.output_tokens
        if not self.final_output:
            output = max(output, math.ceil(self.streamed_chars / CHARS_PER_TOKEN))
        return self.usage.input_tokens + self.usage.cache_read_tokens + self.usage.cache_write_tokens + output

    def feed(self, chunk: bytes, stop: Stop | None = None) -> tuple[bytes, bool]:
        """Read the events this chunk completes; what to forward now: the stream up to its last
        complete event, the bytes untouched (an event split across chunks waits for its end, so
        an error or cut never lands inside one). After each event, `stop()` may end the stream
        there: then the answer ends with that event and says so (True)."""
        buf = self._buffer + chunk if self._buffer else chunk
        if b"\r" not in buf:  # LF line ends, as the providers send them: a split, no regex
            frames = buf.split(b"\n\n")
            rest = frames.pop()
            if stop is None:
                for frame in frames:
                    self._read(frame)
            else:
                start = 0
                for frame in frames:
                    self._read(frame)
                    start += len(frame) + 2
                    if stop():
                        self._buffer = b""
                        return buf[:start], True
            self._buffer = rest
            return (buf[: len(buf) - len(rest)] if rest else buf), False
        start = 0
        for end in _EVENT_END.finditer(buf):
            self._read(buf[start : end.start()])
            start = end.end()
            if stop is not None and stop():
                self._buffer = b""
                return buf[:start], True
        if start == len(buf):
            self._buffer = b""
            return buf, False
        self._buffer = buf[start:]
        return buf[:start], False

    def rest(self) -> bytes:
        """What the stream ended with after its last complete event (normally nothing)."""
        tail, self._buffer = self._buffer, b""
        return tail

    def _read(self, frame: bytes) -> None:
        raise NotImplementedError

    def finish_json(self, body: bytes) -> None:
        try:
            data = json.loads(body)
        except ValueError:
            return
        if isinstance(data, dict):
            self.on_json(data)
            self.final_output = True

    def on_json(self, data: dict[str, Any]) -> None:
        raise NotImplementedError


_ANTHROPIC_EVENT = msgspec.json.Decoder(_AnthropicEvent)
_OPENAI_EVENT = msgspec.json.Decoder(_OpenAIEvent)


class AnthropicMeter(Meter):
    def _usage(self, usage: Any) -> None:
        if not isinstance(usage, dict):
            return
        u = self.usage
        if "input_tokens" in usage:
            u.input_tokens = nonneg(usage["input_tokens"])
        if "cache_read_input_tokens" in usage:
            u.cache_read_tokens = nonneg(usage["cache_read_input_tokens"])
        if "cache_creation_input_tokens" in usage:
            u.cache_write_tokens = nonneg(usage["cache_creation_input_tokens"])
        if "output_tokens" in usage:
            u.output_tokens = nonneg(usage["output_tokens"])

    def _read(self, frame: bytes) -> None:
        # The `event:` line names the event: the ones the meter has no use for stay undecoded.
        if frame.startswith(b"event:"):
            line_end = frame.find(b"\n")
            if frame[6 : line_end if line_end >= 0 else len(frame)].strip() not in _ANTHROPIC_READ:
                return
        data = sse_data(frame)
        if not data:
            return
        try:
            event = _ANTHROPIC_EVENT.decode(data)
        except msgspec.DecodeError:  # not JSON, or not an object
            return
        self.on_event(event)

    def on_event(self, event: _AnthropicEvent) -> None:
        kind = event.type
        if kind == "content_block_delta" and event.delta is not None:
            delta = event.delta
            for value in (delta.text, delta.partial_json, delta.thinking):
                if isinstance(value, str):
                    self.streamed_chars += len(value)
        elif kind == "message_start" and isinstance(event.message, dict):
            message = event.message
            self.model = str(message.get("model") or self.model)
            self._usage(message.get("usage"))
        elif kind == "content_block_start" and isinstance(event.index, int):
            self.open_blocks.add(event.index)
        elif kind == "content_block_stop" and isinstance(event.index, int):
            self.open_blocks.discard(event.index)
        elif kind == "message_delta":
            self._usage(event.usage)
            if isinstance(event.usage, dict) and "output_tokens" in event.usage:
                self.final_output = True
        elif kind == "error" and isinstance(event.error, dict):
            self.error = str(event.error.get("message") or event.error.get("type") or "error")[:500]

    def on_json(self, data: dict[str, Any]) -> None:
        self.model = str(data.get("model") or self.model)
        self._usage(data.get("usage"))


class OpenAIMeter(Meter):
    def _usage(self, usage: Any) -> None:
        if not isinstance(usage, dict):
            return
        details = usage.get("prompt_tokens_details")
        cached = nonneg(details.get("cached_tokens")) if isinstance(details, dict) else 0
        prompt = nonneg(usage.get("prompt_tokens"))
        self.usage.input_tokens = max(prompt - cached, 0)
        self.usage.cache_read_tokens = cached
        self.usage.output_tokens = nonneg(usage.get("completion_tokens"))
        self.final_output = True

    def _read(self, frame: bytes) -> None:
        data = sse_data(frame)
        if not data or data == b"[DONE]":
            return
        try:
            event = _OPENAI_EVENT.decode(data)
        except msgspec.DecodeError:
            return
        self.on_event(event)

    def on_event(self, event: _OpenAIEvent) -> None:
        self.model = str(event.model or self.model)
        for choice in event.choices if isinstance(event.choices, list) else ():
            delta = choice.get("delta") if isinstance(choice, dict) else None
            if not isinstance(delta, dict):
                continue
            if isinstance(delta.get("content"), str):
                self.streamed_chars += len(delta["content"])
            for call in delta.get("tool_calls") or []:
                fn = call.get("function") if isinstance(call, dict) else None
                if isinstance(fn, dict) and isinstance(fn.get("arguments"), str):
                    self.streamed_chars += len(fn["arguments"])
        if event.usage:
            self._usage(event.usage)
        if isinstance(event.error, dict):
            self.error = str(event.error.get("message") or "error")[:500]

    def on_json(self, data: dict[str, Any]) -> None:
        self.model = str(data.get("model") or self.model)
        self._usage(data.get("usage"))


def meter_for(provider: str) -> Meter:
    return AnthropicMeter() if provider == "anthropic" else OpenAIMeter()
