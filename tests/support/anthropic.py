"""A scripted Anthropic Messages server for tests: a real HTTP/1.1 server on 127.0.0.1.

Each test scripts the model's turns; the server answers `POST /v1/messages` with them in order
and records every request (path, query, headers, body), so a test can check what the client
sent and which key reached it. It answers whatever model name it is given.

    with ScriptedAnthropic([tool_use("Bash", {"command": "ls"}), text("done")]) as api:
        env = {"ANTHROPIC_BASE_URL": api.url, "ANTHROPIC_API_KEY": "sk-test"}

`api.url` is the base URL (no `/v1`), as Anthropic clients expect it. A request with
`"stream": true` gets server-sent events framed as the real API frames them (`event:` and
`data:` lines, chunked transfer encoding): `message_start` (usage with input and cache tokens),
`ping`, `content_block_start`/`content_block_delta`/`content_block_stop` for each text block
(`text_delta`) and tool call (`input_json_delta` with `partial_json` pieces), `message_delta`
(`stop_reason`, `usage.output_tokens`) and `message_stop`. Without it, one JSON message.

Turn builders: `text(...)`, `tool_use(name, input, id=None)`, `turn(*turns)` (several blocks in
one answer), `status(429, retry_after=...)`, `status(500)`, `slow(seconds)`, `hang()`.
`POST /v1/messages/count_tokens` answers without using a turn; so does any request the `side`
callable answers (it gets the body and returns a Turn, or None for the script's next turn).
"""

import json
import secrets
from collections.abc import Callable
from typing import Any

import msgspec

from tests.support.scripted import Recorded, ScriptedHandler, ScriptedServer, pieces


class Block(msgspec.Struct, kw_only=True):
    type: str  # "text" | "tool_use"
    text: str = ""
    name: str = ""
    input: Any = None
    id: str = ""


class Turn(msgspec.Struct, kw_only=True):
    status: int = 200
    headers: dict[str, str] = msgspec.field(default_factory=dict)
    blocks: list[Block] = msgspec.field(default_factory=list)
    stop_reason: str = "end_turn"
    input_tokens: int = 10
    output_tokens: int = 5
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    # a text block is sent in this many text_delta events (a tool call's JSON likewise)
    pieces: int = 3
    # seconds before the status line (a slow upstream) and between two SSE events (a slow stream)
    delay: float = 0.0
    event_delay: float = 0.0
    hang: bool = False  # never answer: the client's timeout must end the call
    raw: bytes | None = None  # a body sent as-is (error answers)


_counter = iter(range(1, 1_000_000))


def text(
    content: str,
    *,
    input_tokens: int = 10,
    output_tokens: int = 5,
    cache_read_tokens: int = 0,
    cache_write_tokens: int = 0,
    pieces: int = 3,
    event_delay: float = 0.0,
) -> Turn:
    """The model answers with text and ends its turn."""
    return Turn(
        blocks=[Block(type="text", text=content)],
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        cache_read_tokens=cache_read_tokens,
        cache_write_tokens=cache_write_tokens,
        pieces=pieces,
        event_delay=event_delay,
    )


def tool_use(name: str, input: Any, id: str | None = None, *, text: str = "", **usage: int) -> Turn:
    """The model calls one tool (optionally after some text); stop_reason `tool_use`."""
    blocks = [Block(type="text", text=text)] if text else []
    blocks.append(Block(type="tool_use", name=name, input=input, id=id or f"toolu_{next(_counter):04d}"))
    return Turn(blocks=blocks, stop_reason="tool_use", **usage)


def turn(*turns: Turn, stop_reason: str | None = None) -> Turn:
    """One answer made of the blocks of several builders, e.g. `turn(text("a"), tool_use(...), tool_use(...))`;
    the usage is the first one's, the stop reason the last one's unless given."""
    first = turns[0]
    blocks = [block for t in turns for block in t.blocks]
    return msgspec.structs.replace(first, blocks=blocks, stop_reason=stop_reason or turns[-1].stop_reason)


_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}


def status(code: int, *, retry_after: str | int | None = None, message: str = "scripted failure") -> Turn:
    """An error answer in the Anthropic shape (`{"type":"error","error":{...}}`)."""
    body = {"type": "error", "error": {"type": _ERROR_TYPES.get(code, "api_error"), "message": message}}
    headers = {"retry-after": str(retry_after)} if retry_after is not None else {}
    return Turn(status=code, headers=headers, raw=json.dumps(body).encode())


def slow(seconds: float, then: Turn | None = None) -> Turn:
    """Wait `seconds` before answering (`then`, by default a short text)."""
    return msgspec.structs.replace(then or text("slow answer"), delay=seconds)


def hang() -> Turn:
    """Accept the request and never answer (until the server closes)."""
    return Turn(hang=True)


def sse_events(t: Turn, model: str) -> list[tuple[str, dict[str, Any]]]:
    """The (event, data) pairs of a streamed answer, in the order the real API sends them."""
    message = {
        "id": f"msg_{secrets.token_hex(12)}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {
            "input_tokens": t.input_tokens,
            "cache_creation_input_tokens": t.cache_write_tokens,
            "cache_read_input_tokens": t.cache_read_tokens,
            "output_tokens": 1,
        },
    }
    events: list[tuple[str, dict[str, Any]]] = [
        ("message_start", {"type": "message_start", "message": message}),
        ("ping", {"type": "ping"}),
    ]
    for index, block in enumerate(t.blocks):
        if block.type == "text":
            start: dict[str, Any] = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": piece} for piece in pieces(block.text, t.pieces)]
        else:
            start = {"type": "tool_use", "id": block.id, "name": block.name, "input": {}}
            raw = json.dumps(block.input)
            deltas = [{"type": "input_json_delta", "partial_json": ""}]
            deltas += [{"type": "input_json_delta", "partial_json": piece} for piece in pieces(raw, t.pieces)]
        events.append(("content_block_start", {"type": "content_block_start", "index": index, "content_block": start}))
        events += [("content_block_delta", {"type": "content_block_delta", "index": index, "delta": d}) for d in deltas]
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    events.append(
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": t.stop_reason, "stop_sequence": None},
                "usage": {"output_tokens": t.output_tokens},
            },
        )
    )
    events.append(("message_stop", {"type": "message_stop"}))
    return events


def parse_sse(body: str) -> list[tuple[str, dict[str, Any]]]:
    """The (event, data) pairs of a whole streamed answer, as a client reads them."""
    out = []
    for frame in body.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in frame.splitlines())
        out.append((lines["event"], json.loads(lines["data"])))
    return out


def message_json(t: Turn, model: str) -> dict[str, Any]:
    """The non-streaming answer."""
    content: list[dict[str, Any]] = []
    for block in t.blocks:
        if block.type == "text":
            content.append({"type": "text", "text": block.text})
        else:
            content.append({"type": "tool_use", "id": block.id, "name": block.name, "input": block.input})
    return {
        "id": f"msg_{secrets.token_hex(12)}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": t.stop_reason,
        "stop_sequence": None,
        "usage": {
            "input_tokens": t.input_tokens,
            "cache_creation_input_tokens": t.cache_write_tokens,
            "cache_read_input_tokens": t.cache_read_tokens,
            "output_tokens": t.output_tokens,
        },
    }


def _frames(t: Turn, model: str) -> list[bytes]:
    return [f"event: {event}\ndata: {json.dumps(data)}\n\n".encode() for event, data in sse_events(t, model)]


class _Handler(ScriptedHandler):
    server_api: "ScriptedAnthropic"

    def do_HEAD(self) -> None:  # `HEAD /api/hello`, sent by Claude Code without the traffic opt-out
        self.server_api.record(self, {})
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self) -> None:
        self.server_api.record(self, {})
        self.send_json(404, _NOT_FOUND)

    def do_POST(self) -> None:
        raw_length = int(self.headers.get("Content-Length", "0"))
        body = self.read_json()
        if self.route == "/v1/messages/count_tokens":
            self.send_json(200, {"input_tokens": max(1, raw_length // 4)})
            return
        if self.route != "/v1/messages":
            self.send_json(404, _NOT_FOUND)
            return
        self.answer(body, _frames, message_json)


_NOT_FOUND = {"type": "error", "error": {"type": "not_found_error", "message": "no route"}}


class ScriptedAnthropic(ScriptedServer[Turn]):
    def __init__(
        self,
        turns: list[Turn],
        *,
        repeat_last: bool = False,
        side: Callable[[dict[str, Any]], Turn | None] | None = None,
    ) -> None:
        exhausted = status(500, message="script exhausted")
        super().__init__(turns, repeat_last=repeat_last, handler=_Handler, exhausted=exhausted, route="/v1/messages")
        # Answers requests outside the script (e.g. a session-title request) without using a turn.
        self.side = side
        self.url = f"http://127.0.0.1:{self.port}"

    def turn_for(self, body: dict[str, Any]) -> Turn:
        return (self.side(body) if self.side is not None else None) or self.next_turn()

    # what tests read
    @property
    def messages(self) -> list[Recorded]:
        """The `POST /v1/messages` requests, in order."""
        return self.scripted
