"""OpenAI Responses (`POST /v1/responses`) as the gateway reads it: the usage of a streamed or JSON
answer, the events that end a stream the gateway cuts or loses, and what in a request would make
the provider reach the network (or other people's data) for the agent.

Usage comes only with the end of a stream (`response.completed`, `.incomplete` or `.failed`):
`input_tokens` there includes the cached ones (`input_tokens_details.cached_tokens`, metered as
cache reads, `input_tokens` the rest) and `output_tokens` includes the reasoning ones. Until then
the output is estimated from the deltas (text, function arguments, custom tool input, reasoning).

A stream cut for the budget ends as the API ends one at `max_output_tokens`: `response.incomplete`
(`incomplete_details.reason` "max_output_tokens", the usage so far). The items still open are left
unfinished: a client acts on `response.output_item.done` only, so a half-streamed function call
is never handed to it as done. A stream the upstream breaks off or stops sending ends in
`response.failed` (`error.code` "server_error"), which clients such as Codex retry."""

import json
from typing import Any

import msgspec

from tasks.run.gateway.metering import Meter, nonneg, sse_data
from tasks.run.gateway.request import ModelRequest

_DELTAS = frozenset(
    b"""response.output_text.delta response.function_call_arguments.delta response.custom_tool_call_input.delta
    response.reasoning_summary_text.delta response.reasoning_text.delta response.refusal.delta""".split()
)
_ENDS = frozenset(b"response.completed response.incomplete response.failed".split())
_ITEM_DONE = b"response.output_item.done"
_READ = _DELTAS | _ENDS | {b"response.created", b"error", _ITEM_DONE}


class _Event(msgspec.Struct):
    type: Any = None
    response: Any = None
    delta: Any = None
    message: Any = None
    code: Any = None
    item: Any = None


_EVENT = msgspec.json.Decoder(_Event)


class ResponsesMeter(Meter):
    def __init__(self) -> None:
        super().__init__()
        self.response_id = ""
        self.item_ids: list[str] = []  # the output items this response created
        self.events = 0  # events read so far

    def _item(self, item: Any) -> None:
        if isinstance(item, dict) and isinstance(item.get("id"), str) and len(self.item_ids) < 10_000:
            self.item_ids.append(item["id"][:200])

    def _usage(self, usage: Any) -> None:
        if not isinstance(usage, dict):
            return
        details = usage.get("input_tokens_details")
        cached = nonneg(details.get("cached_tokens")) if isinstance(details, dict) else 0
        self.usage.input_tokens = max(nonneg(usage.get("input_tokens")) - cached, 0)
        self.usage.cache_read_tokens = cached
        self.usage.output_tokens = nonneg(usage.get("output_tokens"))  # reasoning included
        self.final_output = True

    def _response(self, response: Any) -> None:
        if not isinstance(response, dict):
            return
        self.model = str(response.get("model") or self.model)
        if isinstance(response.get("id"), str):
            self.response_id = response["id"][:200]
        self._usage(response.get("usage"))
        output = response.get("output")
        for item in output if isinstance(output, list) else ():
            self._item(item)
        error = response.get("error")
        if isinstance(error, dict):
            self.error = str(error.get("message") or error.get("code") or "error")[:500]

    def _read(self, frame: bytes) -> None:
        self.events += 1
        # The `event:` line names the type: the many events the meter has no use for (items
        # added and done, content parts) pass undecoded.
        if frame.startswith(b"event:"):
            line_end = frame.find(b"\n")
            if frame[6 : line_end if line_end >= 0 else len(frame)].strip() not in _READ:
                return
        data = sse_data(frame)
        if not data:
            return
        try:
            event = _EVENT.decode(data)
        except msgspec.DecodeError:
            return
        kind = event.type
        if isinstance(event.delta, str) and kind in _DELTA_NAMES:
            self.streamed_chars += len(event.delta)
        elif kind in _END_NAMES or kind == "response.created":
            self._response(event.response)
        elif kind == "response.output_item.done":
            self._item(event.item)
        elif kind == "error":
            self.error = str(event.message or event.code or "error")[:500]

    @property
    def next_sequence(self) -> int:
        """The sequence_number of an event the gateway adds (the API numbers its events from 0)."""
        return self.events

    def on_json(self, data: dict[str, Any]) -> None:
        self._response(data)


_DELTA_NAMES = frozenset(name.decode() for name in _DELTAS)
_END_NAMES = frozenset(name.decode() for name in _ENDS)


def _frame(event: dict[str, Any]) -> bytes:
    return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode()


def _ended(meter: ResponsesMeter, status: str) -> dict[str, Any]:
    return {
        "id": meter.response_id,
        "object": "response",
        "status": status,
        "model": meter.model,
        "output": [],
        "error": None,
        "incomplete_details": None,
    }


def stream_end(meter: ResponsesMeter) -> bytes:
    """`response.incomplete` for a stream cut for the run's budget, with the usage so far."""
    response = _ended(meter, "incomplete")
    response["incomplete_details"] = {"reason": "max_output_tokens"}
    output = meter.estimated_total - meter.usage.input_tokens - meter.usage.cache_read_tokens
    cached = meter.usage.cache_read_tokens
    response["usage"] = {
        "input_tokens": meter.usage.input_tokens + cached,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": max(output, 0),
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": meter.estimated_total,
    }
    return _frame({"type": "response.incomplete", "response": response, "sequence_number": meter.next_sequence})


def stream_error(meter: ResponsesMeter, message: str) -> bytes:
    """`response.failed` for a stream the upstream broke off or stopped sending."""
    response = _ended(meter, "failed")
    response["error"] = {"code": "server_error", "message": message}
    return _frame({"type": "response.failed", "response": response, "sequence_number": meter.next_sequence})


# Hosted tools the provider runs on its side: web search reaches the network; file search reads
# the provider's vector stores (data of whoever owns the key, not of this run); code interpreter,
# computer use and image generation run in the provider's containers; `mcp` calls remote MCP
# servers and connectors (Google Drive, Gmail...). Client tools (`function`, `custom`,
# `local_shell`, `shell`, `apply_patch`) run in the sandbox and pass.
_WEB_SEARCH = ("web_search",)  # web_search, web_search_preview, web_search_2025_08_26...
_HOSTED = ("file_search", "code_interpreter", "computer", "image_generation", "mcp", "connector")


class Stored:
    """What this run's own calls created on the provider's side (the ids of its responses and of
    their output items): the only provider-side state its later calls may name."""

    def __init__(self) -> None:
        self.responses: set[str] = set()
        self.items: set[str] = set()

    def add(self, meter: "ResponsesMeter") -> None:
        if meter.response_id:
            self.responses.add(meter.response_id)
        self.items.update(meter.item_ids)


def refusal(request: ModelRequest, *, allow_web_search: bool, stored: Stored) -> str:
    """Why this Responses request must not be forwarded ("" when it may be).

    `previous_response_id` continues a conversation the provider stored, and an `input[]` item of
    type `item_reference` names a stored item: allowed only for what this run's own calls
    created, so a run cannot read another run's (or anyone's) stored state under a shared key.
    `conversation` (the Conversations API) and `prompt` (a stored prompt template, which brings
    its own instructions and tools, unchecked) are provider-side state this run did not create.
    `background` runs the response detached from this call, past the run's end and outside its
    metering: anything but absent, null or false is refused."""
    if request.value("background") not in (None, False):
        return "a background response (background) would run outside the run and its budget"
    if request.value("conversation") is not None:
        return "a provider-side conversation (conversation) is state this run did not create"
    if request.value("prompt") is not None:
        return "a stored prompt template (prompt) brings instructions and tools the gateway cannot check"
    previous = request.value("previous_response_id")
    if previous is not None and (not isinstance(previous, str) or previous not in stored.responses):
        return "previous_response_id names a response this run did not create"
    for ref in request.item_references():
        if not isinstance(ref, str) or ref not in stored.items:
            return "an input item_reference names an item this run did not create"
    for kind in request.tool_types():
        if not isinstance(kind, str):
            continue
        if kind.startswith(_WEB_SEARCH):
            if not allow_web_search:
                return f"the hosted tool {kind!r} would reach the network (the repository does not allow web search)"
        elif kind.startswith(_HOSTED):
            return f"the hosted tool {kind!r} would run on the provider's side, outside the sandbox"
    return ""
