"""A scripted OpenAI Responses server for tests: a real HTTP/1.1 server on 127.0.0.1.

Each test scripts the model's turns; the server answers `POST /v1/responses` with them in order
and records every request (method, path, query, headers, body), so a test can check what the
client sent (the input items, the tools, the key). It answers whatever model name it is given.

    with ScriptedResponses([function_call("exec_command", {"cmd": "ls"}), text("done")]) as api:
        provider = {"base_url": api.url, "wire_api": "responses", "env_key": "OPENAI_API_KEY"}

`api.url` is the base URL *with* `/v1` (`http://127.0.0.1:PORT/v1`), as OpenAI clients and
Codex's `model_providers.<name>.base_url` expect it. A request with `"stream": true` gets
server-sent events framed as the real API frames them (an `event:` line naming the type, one
`data:` line of JSON that repeats it in `type`, a `sequence_number` on every event, chunked
transfer encoding): `response.created`, `response.in_progress`, then per output item
`response.output_item.added` ... `response.output_item.done` (a message: `content_part.added`,
`output_text.delta` pieces, `output_text.done`, `content_part.done`; a function call:
`function_call_arguments.delta`/`.done`; a freeform custom tool call:
`custom_tool_call_input.delta`/`.done`; a reasoning item: `reasoning_summary_part.added`,
`reasoning_summary_text.delta`/`.done`, `reasoning_summary_part.done`), and last
`response.completed` with `usage{input_tokens, input_tokens_details{cached_tokens},
output_tokens, output_tokens_details{reasoning_tokens}, total_tokens}` (the real API's
convention: `input_tokens` includes the cached ones, `output_tokens` the reasoning ones).
Without `stream`, the finished response object as JSON.

Turn builders: `text(...)`, `function_call(name, arguments, call_id=None)` (`arguments` a dict,
or a raw string for malformed JSON), `custom_tool_call(name, input, call_id=None)` (freeform
tools such as Codex's `apply_patch`), `reasoning(summary)`, `turn(*turns)` (several items in one
answer), `status(429, retry_after=...)`, `status(500)`, `failed(code, message)` (a stream that
ends in `response.failed`), `error_event(code, message)` (a stream that ends in an `error`
event and no `response.completed`), `slow(seconds)`, `hang()`.

What Codex (codex-rs `codex-api/src/sse/responses.rs`, `protocol/src/models.rs`) accepts, read
from its source:
- It reads each event's `type` from the JSON `data:` (the `event:` line is not used) and ignores
  types it does not know, and data that is not JSON.
- Items reach it only through `response.output_item.done` (and `.added`); it parses `item` as
  its `ResponseItem`: `{"type":"message","role":"assistant","content":[{"type":"output_text",
  "text":...}]}`, `{"type":"function_call","name","arguments" (a JSON *string*),"call_id"}`,
  `{"type":"custom_tool_call","call_id","name","input" (a string)}`, `{"type":"reasoning",
  "summary":[{"type":"summary_text","text"}],"encrypted_content":null}`. An item it cannot parse
  is skipped. `output_text.delta` (`delta`) is what it shows as streaming text;
  `reasoning_summary_text.delta` needs `summary_index`.
- `response.created` must carry a `response` object. `response.completed` must carry
  `response.id` (a string); its `usage`, when present, needs `input_tokens`, `output_tokens` and
  `total_tokens` (integers), the two `*_details` objects are optional.
- A stream that ends without `response.completed` is an error to it ("stream closed before
  response.completed"), retried up to the provider's `stream_max_retries`; so are
  `response.failed` (its `response.error.code`: `context_length_exceeded`,
  `insufficient_quota`, `usage_not_included` are final; `rate_limit_exceeded` with "try again in
  Ns" in the message is retried after N s) and, in newer versions, `response.incomplete`. An
  `error` event is not read by it: the stream then ends without `response.completed`.
- Its tools: `exec_command` / `shell` / `shell_command` are function tools (JSON arguments: e.g.
  `{"cmd": "..."}`, `{"command": ["bash", "-lc", "..."]}`, `{"command": "..."}`, depending on the
  model family and features); `apply_patch` is a freeform custom tool (`"type": "custom"` in the
  request's tools, a grammar format) whose call is a `custom_tool_call` with the patch text as
  `input` (`*** Begin Patch` ... `*** End Patch`), or, for models without freeform tools, a
  function tool with `{"input": patch}`.
"""

import json
import secrets
import time
from typing import Any

import msgspec

from tests.support.scripted import Recorded, ScriptedHandler, ScriptedServer, pieces


class Item(msgspec.Struct, kw_only=True):
    type: str  # "message" | "function_call" | "custom_tool_call" | "reasoning"
    text: str = ""  # a message's text, a reasoning item's summary
    name: str = ""
    arguments: str = ""  # a function call's arguments (a JSON string, as the API sends them)
    input: str = ""  # a custom tool call's input
    call_id: str = ""
    id: str = ""


class Turn(msgspec.Struct, kw_only=True):
    status: int = 200
    headers: dict[str, str] = msgspec.field(default_factory=dict)
    items: list[Item] = msgspec.field(default_factory=list)
    input_tokens: int = 10  # including the cached ones (the API's convention)
    cached_tokens: int = 0
    output_tokens: int = 5  # including the reasoning ones
    reasoning_tokens: int = 0
    # a text (or arguments, input, summary) is sent in this many delta events
    pieces: int = 3
    # seconds before the status line (a slow upstream) and between two SSE events (a slow stream)
    delay: float = 0.0
    event_delay: float = 0.0
    hang: bool = False  # never answer: the client's timeout must end the call
    raw: bytes | None = None  # a body sent as-is (error answers)
    # the stream's end instead of `response.completed`: ("failed", code, message) or ("error", ...)
    ending: tuple[str, str, str] | None = None


_counter = iter(range(1, 1_000_000))


def text(
    content: str,
    *,
    input_tokens: int = 10,
    cached_tokens: int = 0,
    output_tokens: int = 5,
    reasoning_tokens: int = 0,
    pieces: int = 3,
    event_delay: float = 0.0,
) -> Turn:
    """The model answers with one assistant message."""
    return Turn(
        items=[Item(type="message", text=content)],
        input_tokens=input_tokens,
        cached_tokens=cached_tokens,
        output_tokens=output_tokens,
        reasoning_tokens=reasoning_tokens,
        pieces=pieces,
        event_delay=event_delay,
    )


def function_call(name: str, arguments: Any, call_id: str | None = None, *, text: str = "", **usage: Any) -> Turn:
    """The model calls one function tool (optionally after a message); `arguments` a dict, or a
    raw string (sent as it is, e.g. malformed JSON)."""
    items = [Item(type="message", text=text)] if text else []
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
    items.append(Item(type="function_call", name=name, arguments=raw, call_id=call_id or f"call_{next(_counter):04d}"))
    return Turn(items=items, **usage)


def custom_tool_call(name: str, input: str, call_id: str | None = None, *, text: str = "", **usage: Any) -> Turn:
    """The model calls one freeform custom tool (Codex's `apply_patch`) with `input` as its text."""
    items = [Item(type="message", text=text)] if text else []
    items.append(Item(type="custom_tool_call", name=name, input=input, call_id=call_id or f"call_{next(_counter):04d}"))
    return Turn(items=items, **usage)


def reasoning(summary: str, then: Turn | None = None, *, reasoning_tokens: int = 8) -> Turn:
    """A reasoning item (its summary streamed) before `then`'s items; its tokens are counted in
    `output_tokens` as the API does."""
    rest = then or text("done")
    return msgspec.structs.replace(
        rest,
        items=[Item(type="reasoning", text=summary), *rest.items],
        reasoning_tokens=rest.reasoning_tokens + reasoning_tokens,
        output_tokens=rest.output_tokens + reasoning_tokens,
    )


def turn(*turns: Turn) -> Turn:
    """One answer made of the items of several builders, e.g. `turn(text("a"), function_call(...))`;
    the usage is the first one's."""
    return msgspec.structs.replace(turns[0], items=[item for t in turns for item in t.items])


_ERROR_TYPES = {
    400: ("invalid_request_error", None),
    401: ("invalid_request_error", "invalid_api_key"),
    403: ("invalid_request_error", None),
    404: ("invalid_request_error", None),
    429: ("requests", "rate_limit_exceeded"),
    500: ("server_error", None),
    503: ("server_error", None),
}


def status(code: int, *, retry_after: str | int | None = None, message: str = "scripted failure") -> Turn:
    """An error answer in OpenAI's shape (`{"error":{"message","type","param","code"}}`)."""
    kind, err_code = _ERROR_TYPES.get(code, ("server_error", None))
    body = {"error": {"message": message, "type": kind, "param": None, "code": err_code}}
    headers = {"retry-after": str(retry_after)} if retry_after is not None else {}
    return Turn(status=code, headers=headers, raw=json.dumps(body).encode())


def failed(code: str = "server_error", message: str = "scripted failure", then: Turn | None = None) -> Turn:
    """A stream that streams `then`'s items (none by default) and ends in `response.failed`."""
    base = then or Turn()
    return msgspec.structs.replace(base, ending=("failed", code, message))


def error_event(code: str = "server_error", message: str = "scripted failure", then: Turn | None = None) -> Turn:
    """A stream that ends in an `error` event (no `response.completed`)."""
    base = then or Turn()
    return msgspec.structs.replace(base, ending=("error", code, message))


def slow(seconds: float, then: Turn | None = None) -> Turn:
    """Wait `seconds` before answering (`then`, by default a short text)."""
    return msgspec.structs.replace(then or text("slow answer"), delay=seconds)


def hang() -> Turn:
    """Accept the request and never answer (until the server closes)."""
    return Turn(hang=True)


def usage_of(t: Turn) -> dict[str, Any]:
    return {
        "input_tokens": t.input_tokens,
        "input_tokens_details": {"cached_tokens": t.cached_tokens},
        "output_tokens": t.output_tokens,
        "output_tokens_details": {"reasoning_tokens": t.reasoning_tokens},
        "total_tokens": t.input_tokens + t.output_tokens,
    }


def _item_ids(t: Turn) -> list[str]:
    prefix = {"message": "msg", "function_call": "fc", "custom_tool_call": "ctc", "reasoning": "rs"}
    return [item.id or f"{prefix.get(item.type, 'it')}_{secrets.token_hex(12)}" for item in t.items]


def _done_item(item: Item, item_id: str) -> dict[str, Any]:
    if item.type == "message":
        return {
            "id": item_id,
            "type": "message",
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": item.text, "annotations": [], "logprobs": []}],
        }
    if item.type == "function_call":
        return {
            "id": item_id,
            "type": "function_call",
            "status": "completed",
            "arguments": item.arguments,
            "call_id": item.call_id,
            "name": item.name,
        }
    if item.type == "custom_tool_call":
        return {
            "id": item_id,
            "type": "custom_tool_call",
            "status": "completed",
            "call_id": item.call_id,
            "name": item.name,
            "input": item.input,
        }
    return {
        "id": item_id,
        "type": "reasoning",
        "summary": [{"type": "summary_text", "text": item.text}] if item.text else [],
        "encrypted_content": None,
    }


def _added_item(item: Item, item_id: str) -> dict[str, Any]:
    out = _done_item(item, item_id)
    if item.type == "message":
        out.update(status="in_progress", content=[])
    elif item.type == "function_call":
        out.update(status="in_progress", arguments="")
    elif item.type == "custom_tool_call":
        out.update(status="in_progress", input="")
    else:
        out["summary"] = []
    return out


def response_object(
    t: Turn, model: str, response_id: str, *, status: str, output: list[dict[str, Any]], usage: bool
) -> dict[str, Any]:
    return {
        "id": response_id,
        "object": "response",
        "created_at": int(time.time()),
        "status": status,
        "error": None,
        "incomplete_details": None,
        "model": model,
        "output": output,
        "parallel_tool_calls": True,
        "store": False,
        "usage": usage_of(t) if usage else None,
    }


def _item_events(item: Item, item_id: str, index: int, count: int) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = [
        {"type": "response.output_item.added", "output_index": index, "item": _added_item(item, item_id)}
    ]
    at = {"item_id": item_id, "output_index": index}
    if item.type == "message":
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        events.append({"type": "response.content_part.added", **at, "content_index": 0, "part": part})
        events += [
            {"type": "response.output_text.delta", **at, "content_index": 0, "delta": piece, "logprobs": []}
            for piece in pieces(item.text, count)
        ]
        finished = {"content_index": 0, "text": item.text, "logprobs": []}
        events.append({"type": "response.output_text.done", **at, **finished})
        done_part = dict(part, text=item.text)
        events.append({"type": "response.content_part.done", **at, "content_index": 0, "part": done_part})
    elif item.type == "function_call":
        events += [
            {"type": "response.function_call_arguments.delta", **at, "delta": piece}
            for piece in pieces(item.arguments, count)
        ]
        events.append({"type": "response.function_call_arguments.done", **at, "arguments": item.arguments})
    elif item.type == "custom_tool_call":
        events += [
            {"type": "response.custom_tool_call_input.delta", **at, "delta": piece}
            for piece in pieces(item.input, count)
        ]
        events.append({"type": "response.custom_tool_call_input.done", **at, "input": item.input})
    elif item.text:
        part = {"type": "summary_text", "text": ""}
        events.append({"type": "response.reasoning_summary_part.added", **at, "summary_index": 0, "part": part})
        events += [
            {"type": "response.reasoning_summary_text.delta", **at, "summary_index": 0, "delta": piece}
            for piece in pieces(item.text, count)
        ]
        events.append({"type": "response.reasoning_summary_text.done", **at, "summary_index": 0, "text": item.text})
        done_part = dict(part, text=item.text)
        events.append({"type": "response.reasoning_summary_part.done", **at, "summary_index": 0, "part": done_part})
    events.append({"type": "response.output_item.done", "output_index": index, "item": _done_item(item, item_id)})
    return events


def sse_events(t: Turn, model: str) -> list[dict[str, Any]]:
    """The events (each with its `type` and `sequence_number`) of a streamed answer, in the
    order the real API sends them."""
    response_id = f"resp_{secrets.token_hex(16)}"
    ids = _item_ids(t)
    start = response_object(t, model, response_id, status="in_progress", output=[], usage=False)
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": start},
        {"type": "response.in_progress", "response": start},
    ]
    for index, (item, item_id) in enumerate(zip(t.items, ids, strict=True)):
        events += _item_events(item, item_id, index, t.pieces)
    output = [_done_item(item, item_id) for item, item_id in zip(t.items, ids, strict=True)]
    if t.ending is None:
        done = response_object(t, model, response_id, status="completed", output=output, usage=True)
        events.append({"type": "response.completed", "response": done})
    elif t.ending[0] == "failed":
        end = response_object(t, model, response_id, status="failed", output=output, usage=False)
        end["error"] = {"code": t.ending[1], "message": t.ending[2]}
        events.append({"type": "response.failed", "response": end})
    else:
        events.append({"type": "error", "code": t.ending[1], "message": t.ending[2], "param": None})
    for n, event in enumerate(events):
        event["sequence_number"] = n
    return events


def frame(event: dict[str, Any]) -> bytes:
    return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode()


def parse_sse(body: str) -> list[dict[str, Any]]:
    """The events of a whole streamed answer, as a client reads them (each `data:` as JSON; a
    frame whose `event:` line and `type` disagree fails the assertion)."""
    out = []
    for chunk in body.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in chunk.splitlines())
        data = json.loads(lines["data"])
        assert lines.get("event", data.get("type")) == data.get("type"), chunk
        out.append(data)
    return out


def response_json(t: Turn, model: str) -> dict[str, Any]:
    """The non-streaming answer: the finished response object."""
    ids = _item_ids(t)
    output = [_done_item(item, item_id) for item, item_id in zip(t.items, ids, strict=True)]
    return response_object(t, model, f"resp_{secrets.token_hex(16)}", status="completed", output=output, usage=True)


_NOT_FOUND = {"error": {"message": "no route", "type": "invalid_request_error", "param": None, "code": None}}


def _frames(t: Turn, model: str) -> list[bytes]:
    return [frame(event) for event in sse_events(t, model)]


class _Handler(ScriptedHandler):
    server_api: "ScriptedResponses"
    request_id_header = "x-request-id"

    def do_GET(self) -> None:
        self.server_api.record(self, {})
        self.send_json(404, _NOT_FOUND)

    def do_POST(self) -> None:
        body = self.read_json()
        if self.route != "/v1/responses":
            self.send_json(404, _NOT_FOUND)
            return
        self.answer(body, _frames, response_json)


class ScriptedResponses(ScriptedServer[Turn]):
    def __init__(self, turns: list[Turn], *, repeat_last: bool = False) -> None:
        exhausted = status(500, message="script exhausted")
        super().__init__(turns, repeat_last=repeat_last, handler=_Handler, exhausted=exhausted, route="/v1/responses")
        self.url = f"http://127.0.0.1:{self.port}/v1"

    # what tests read
    @property
    def responses(self) -> list[Recorded]:
        """The `POST /v1/responses` requests, in order."""
        return self.scripted
