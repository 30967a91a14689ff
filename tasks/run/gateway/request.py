"""An agent's model request as the gateway reads it, checks it and forwards it.

One parse for the checks and the provider: the top level is decoded as `dict[str, msgspec.Raw]`
and re-encoded, and so is each object of the levels the checks read below it (`tools[]`, and
Responses' `input[]`). Where a body repeats a key, msgspec keeps the last one, and the forwarded
body then holds that one only: the provider sees exactly what the checks read, whichever of two
duplicates a provider's parser would have kept. Refusing duplicates instead would need a second,
slower parse of every request (msgspec drops them silently) for bodies no client sends. Deeper
values (messages, schemas) pass byte for byte: no check reads them.

The model is the run's (`pinned_model`): the agent names one, but the budget counts tokens, not
dollars, so a free choice of model could spend 10-100x more within it. `service_tier` is dropped
(the provider's default tier): "priority" is billed at a premium per token."""

from typing import Any

import msgspec

from forge.core.error_codes import Code
from tasks.run.gateway.metering import PriceTable

# Fields the gateway removes before forwarding: what would bill the same tokens at a higher rate
# (OpenAI's and Anthropic's priority tiers, Anthropic's fast mode).
DROPPED = ("service_tier", "speed")

_TOP = msgspec.json.Decoder(dict[str, msgspec.Raw])
_OBJECTS = msgspec.json.Decoder(list[dict[str, msgspec.Raw]] | None)
_INPUT = msgspec.json.Decoder(str | list[dict[str, msgspec.Raw]] | None)
_VALUE: msgspec.json.Decoder[Any] = msgspec.json.Decoder()
_ENCODE = msgspec.json.Encoder()


class Refused(Exception):
    """The request is not forwarded: the status, the registered code, and what the agent is told."""

    def __init__(self, status: int, code: Code, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message

    @property
    def kind(self) -> str:
        """The provider's error type for the status (both APIs name these alike)."""
        return "invalid_request_error" if self.status == 400 else "permission_error"


def _bad(text: str) -> Refused:
    return Refused(400, Code.GATEWAY_BAD_REQUEST, f"forgehand: {text}")


class ModelRequest:
    """The fields of one request, each read once; `body()` is what goes to the provider."""

    __slots__ = ("fields", "items", "model", "requested_model", "stream", "tools")

    def __init__(self, body: bytes, *, items: bool) -> None:
        try:
            self.fields = _TOP.decode(body or b"{}")
        except (msgspec.DecodeError, msgspec.ValidationError):
            raise _bad("the request body is not a JSON object") from None
        model = self.value("model")
        self.requested_model = model if isinstance(model, str) else ""
        self.model = self.requested_model
        self.stream = self.value("stream") is True
        self.tools = self._objects("tools", _OBJECTS, "tools must be a list of objects")
        self.items: Any = (
            self._objects("input", _INPUT, "input must be a string or a list of objects") if items else None
        )

    def _objects(self, name: str, decoder: msgspec.json.Decoder[Any], text: str) -> Any:
        raw = self.fields.get(name)
        if raw is None:
            return None
        try:
            return decoder.decode(raw)
        except (msgspec.DecodeError, msgspec.ValidationError):
            raise _bad(text) from None

    def value(self, name: str, within: dict[str, msgspec.Raw] | None = None) -> Any:
        """A field decoded (None when absent), at the top level or of one of its objects."""
        raw = (self.fields if within is None else within).get(name)
        return None if raw is None else _VALUE.decode(raw)

    def tool_types(self) -> list[Any]:
        return [self.value("type", tool) for tool in self.tools or ()]

    def item_references(self) -> list[Any]:
        """The ids of Responses `input[]` items that name a stored item: of type `item_reference`,
        or with an `id` and no type (the API's type is optional on a reference). An item the agent
        writes out in full (a message, a function call's output) carries its type."""
        items = self.items if isinstance(self.items, list) else ()
        refs = []
        for item in items:
            kind = self.value("type", item)
            if kind == "item_reference" or (kind is None and "id" in item):
                refs.append(self.value("id", item))
        return refs

    def body(self) -> bytes:
        fields = self.fields
        if self.model and self.model != self.requested_model:
            fields["model"] = msgspec.Raw(_ENCODE.encode(self.model))
        for name in DROPPED:
            fields.pop(name, None)
        if self.tools is not None:
            fields["tools"] = msgspec.Raw(_ENCODE.encode(self.tools))
        if isinstance(self.items, list):
            fields["input"] = msgspec.Raw(_ENCODE.encode(self.items))
        return _ENCODE.encode(fields)


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def declared_max_output(request: ModelRequest, *, responses_api: bool) -> int | None:
    """The most output tokens a call says it may produce (None: it sets no maximum, or one the
    provider would refuse): Responses' `max_output_tokens`; Messages' `max_tokens`; chat's
    `max_completion_tokens` or the older `max_tokens` (the larger), for each of its `n` choices.
    The provider stops the answer there (reasoning and thinking tokens included)."""
    if responses_api:
        return _count(request.value("max_output_tokens"))
    declared = [n for n in (_count(request.value(k)) for k in ("max_tokens", "max_completion_tokens")) if n]
    if not declared:
        return None
    return max(declared) * (_count(request.value("n")) or 1)


def pinned_model(requested: str, configured: str, prices: PriceTable) -> str | None:
    """The model a call goes to: the run's configured one, or the requested one where it is that
    model or one the price table names exactly (not by a `prefix*` entry) at no more than it, per
    token of every kind (a cheaper model, such as the small fast one Claude Code's subagents ask
    for, passes as asked when the table lists it). None:
    the request is refused (no model is configured and the price table, which then lists the
    models a run may use, does not price the requested one). Neither a model nor a price table:
    the agent's choice passes, there is nothing to pin it to."""
    if not configured:
        if not prices.prices:
            return requested
        return requested if requested and prices.find(requested) is not None else None
    if requested == configured or not requested:
        return configured
    # Only a model the table names exactly may go instead: a `prefix*` entry prices a family for
    # metering, and would let its priciest member pass as "not above" the configured one.
    mine, theirs = prices.find(configured), prices.prices.get(requested)
    if mine is not None and theirs is not None and theirs.not_above(mine):
        return requested
    return configured


def network_refusal(request: ModelRequest) -> str:
    """Why the provider would reach the network for this Messages or chat request ("" when it
    would not): the sandbox has no network, and a server-side tool must not become the way
    around it (its MCP connector, its code-execution container, web search or fetch)."""
    if request.value("mcp_servers") is not None:
        return "the MCP connector (mcp_servers)"
    if request.value("container") is not None:
        return "a code-execution container"
    if request.value("web_search_options") is not None:
        return "web search (web_search_options)"
    for kind in request.tool_types():
        # A client tool has no type (Anthropic), "custom" or "function".
        if isinstance(kind, str) and kind.startswith(("web_", "code_execution", "mcp")):
            return f"the server-side tool {kind!r}"
    return ""
