"""Forwarding one model call upstream: Anthropic Messages, OpenAI chat completions and OpenAI
Responses (tasks/run/gateway/responses.py), with the real key injected here on the host, the
answer streamed back chunk by chunk as it arrives, its usage metered, and the run's token budget
enforced (budget.py; a stream is cut at an event boundary and ended the way the provider ends
one, so the client sees a finished answer, never a hang).

Upstream trouble reaches the agent as the provider would say it: the upstream's own status and
body (429 with Retry-After, 500...), or a 502/504 in the provider's error shape when the endpoint
cannot be reached, is refused by the URL guard (tasks/run/gateway/guard.py) or does not answer in
time (`x-forgehand-gateway: unreachable|refused|timeout`)."""

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import msgspec

from tasks.run.gateway import responses
from tasks.run.gateway.budget import GATEWAY_HEADER, Budget
from tasks.run.gateway.guard import EndpointRefused
from tasks.run.gateway.metering import Meter, meter_for

MAX_REQUEST_BYTES = 32 * 1024 * 1024  # Anthropic's own request limit
MAX_JSON_ANSWER_BYTES = 64 * 1024 * 1024

Send = Callable[[dict[str, Any]], Awaitable[None]]

# Request headers an agent may pass on (the rest, its credentials first, stay here).
_PASS_REQUEST = {"anthropic-version", "anthropic-beta", "content-type", "accept", "user-agent", "openai-beta"}
_PASS_ANSWER_PREFIXES = ("anthropic-", "x-ratelimit-", "openai-")
_PASS_ANSWER = {"content-type", "retry-after", "request-id", "x-request-id", "cache-control"}


_MORE = {"more_body": True}
_TIMEOUT = [(GATEWAY_HEADER.encode(), b"timeout")]
_UNREACHABLE = [(GATEWAY_HEADER.encode(), b"unreachable")]
_BUDGET = [(GATEWAY_HEADER.encode(), b"budget")]
_RESERVED = [(GATEWAY_HEADER.encode(), b"budget-reserved"), (b"retry-after", b"1")]
_REFUSED = [(GATEWAY_HEADER.encode(), b"refused")]


class Upstream(msgspec.Struct, frozen=True, kw_only=True):
    provider: str  # "anthropic" | "openai"
    base_url: str  # Anthropic: without /v1 (https://api.anthropic.com); OpenAI: with it (.../v1)
    api_key: str
    model: str
    timeout: float
    # The endpoint is a repository's or a person's choice, not the operator's: its addresses are
    # checked at every connection (tasks/run/gateway/guard.py).
    guarded: bool = False

    def url(self, path: str, query: str) -> str:
        base = self.base_url.rstrip("/")
        tail = path if self.provider == "anthropic" else path.removeprefix("/v1")
        return f"{base}{tail}" + (f"?{query}" if query else "")

    def headers(self, incoming: dict[str, str]) -> dict[str, str]:
        out = {k: v for k, v in incoming.items() if k in _PASS_REQUEST}
        out["accept-encoding"] = "identity"  # the bytes are metered as they pass: no compression
        if self.api_key:
            if self.provider == "anthropic":
                out["x-api-key"] = self.api_key
                out.setdefault("anthropic-version", "2023-06-01")
            else:
                out["authorization"] = f"Bearer {self.api_key}"
        return out


class ToolHead(msgspec.Struct):
    type: Any = None


class RequestHead(msgspec.Struct):
    model: Any = None
    stream: Any = None
    # What would make the provider reach the network for the agent (AGENTS.md decision 6): its
    # server-side tools, its MCP connector, its code-execution container, OpenAI's web search.
    tools: list[ToolHead] | None = None
    mcp_servers: Any = None
    container: Any = None
    web_search_options: Any = None


# Tool types the provider runs on its side with network access (web search/fetch, code execution
# in its container, MCP toolsets). A client tool has no type (Anthropic), "custom" or "function".
_NETWORK_TOOL_PREFIXES = ("web_", "code_execution", "mcp")


def network_refusal(head: RequestHead) -> str:
    """Why the provider would reach the network for this request ("" when it would not): the
    sandbox has no network, and a server-side tool must not become the way around it."""
    if head.mcp_servers is not None:
        return "the MCP connector (mcp_servers)"
    if head.container is not None:
        return "a code-execution container"
    if head.web_search_options is not None:
        return "web search (web_search_options)"
    for tool in head.tools or ():
        kind = tool.type
        if isinstance(kind, str) and kind.startswith(_NETWORK_TOOL_PREFIXES):
            return f"the server-side tool {kind!r}"
    return ""


_REQUEST_HEAD = msgspec.json.Decoder(RequestHead)


class CallResult(msgspec.Struct, kw_only=True):
    status: int
    model: str
    stream: bool
    meter: Meter
    latency_ms: int = 0
    ttfb_ms: int | None = None
    error: str = ""


def error_body(provider: str, status: int, kind: str, message: str) -> bytes:
    if provider == "anthropic":
        return json.dumps({"type": "error", "error": {"type": kind, "message": message}}).encode()
    return json.dumps({"error": {"message": message, "type": kind, "code": kind}}).encode()


async def send_json(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
            + (headers or []),
        }
    )
    await send({"type": "http.response.body", "body": body})


def _answer_headers(resp: httpx.Response) -> list[tuple[bytes, bytes]]:
    out = []
    for key, value in resp.headers.items():
        k = key.lower()
        if k in _PASS_ANSWER or k.startswith(_PASS_ANSWER_PREFIXES):
            out.append((k.encode(), value.encode()))
    return out


class BodyChunks:
    """The upstream's body as it arrives, what came in together handed on as one piece: a burst
    of events read in one go reaches the agent in one write (one parse at its end), not one per
    event. A reader task pulls from httpx while the agent's side sends; past `HELD` bytes not yet
    sent it waits, so a slow agent slows the upstream read rather than filling memory."""

    HELD = 1024 * 1024

    def __init__(self, resp: httpx.Response) -> None:
        self._parts: list[bytes] = []
        self._size = 0
        # Bare futures, not asyncio.Events: one hand-over per upstream read, kept cheap.
        self._ready: asyncio.Future[None] | None = None  # the sending side waits for bytes
        self._room: asyncio.Future[None] | None = None  # the reader waits for the agent
        self._done = False
        self._error: Exception | None = None
        self._reader = asyncio.ensure_future(self._read(resp))

    def _wake(self) -> None:
        if self._ready is not None and not self._ready.done():
            self._ready.set_result(None)

    async def _read(self, resp: httpx.Response) -> None:
        try:
            async for piece in resp.aiter_raw():
                self._parts.append(piece)
                self._size += len(piece)
                self._wake()
                if self._size >= self.HELD:
                    self._room = asyncio.get_running_loop().create_future()
                    await self._room
        except Exception as exc:  # handed to the sending side, which answers it
            self._error = exc
        finally:
            self._done = True
            self._wake()

    async def next(self) -> bytes | None:
        """What arrived since the last call (waiting for something); None at the body's end."""
        while not self._parts:
            if self._done:
                if self._error is not None:
                    raise self._error
                return None
            self._ready = asyncio.get_running_loop().create_future()
            await self._ready
        parts = self._parts
        out = parts[0] if len(parts) == 1 else b"".join(parts)
        parts.clear()
        self._size = 0
        if self._room is not None and not self._room.done():
            self._room.set_result(None)
        return out

    async def close(self) -> None:
        if not self._reader.done():
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader


def _stream_end(provider: str, meter: Meter) -> bytes:
    """The events that end a stream cut for the budget, as the provider ends one at max_tokens."""
    if isinstance(meter, responses.ResponsesMeter):
        return responses.stream_end(meter)
    if provider == "anthropic":
        frames = [("content_block_stop", {"type": "content_block_stop", "index": i}) for i in sorted(meter.open_blocks)]
        output = meter.estimated_total - meter.usage.input_tokens - meter.usage.cache_read_tokens
        output -= meter.usage.cache_write_tokens
        frames.append(
            (
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": "max_tokens", "stop_sequence": None},
                    "usage": {"output_tokens": max(output, 0)},
                },
            )
        )
        frames.append(("message_stop", {"type": "message_stop"}))
        return b"".join(f"event: {e}\ndata: {json.dumps(d)}\n\n".encode() for e, d in frames)
    last = {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}
    return f"data: {json.dumps(last)}\n\ndata: [DONE]\n\n".encode()


def _stream_error(provider: str, meter: Meter, message: str) -> bytes:
    if isinstance(meter, responses.ResponsesMeter):
        return responses.stream_error(meter, message)
    if provider == "anthropic":
        data = {"type": "error", "error": {"type": "api_error", "message": message}}
        return f"event: error\ndata: {json.dumps(data)}\n\n".encode()
    return f"data: {json.dumps({'error': {'message': message, 'type': 'api_error'}})}\n\n".encode()


async def _upstream_failed(send: Send, upstream: Upstream, exc: Exception, *, started: bool) -> tuple[int, str]:
    """The agent's answer when the endpoint cannot be reached, or does not answer (or finish its
    answer) in time: 502 or 504 in the provider's shape."""
    if isinstance(exc, httpx.TimeoutException):
        what = "finish its answer" if started else "answer"
        status, kind, said = 504, "timeout_error", _TIMEOUT
        text = f"the model endpoint did not {what} within {upstream.timeout:g} s"
    elif isinstance(exc, EndpointRefused):
        status, kind, said = 502, "api_error", _REFUSED
        text = f"forgehand: the model endpoint is refused: {exc}"
    else:
        status, kind, said = 502, "api_error", _UNREACHABLE
        text = "the model endpoint " + ("broke off its answer" if started else "is unreachable")
        text += f" ({type(exc).__name__})"
    await send_json(send, status, error_body(upstream.provider, status, kind, text), said)
    return status, text


async def forward(
    client: httpx.AsyncClient,
    upstream: Upstream,
    *,
    path: str,
    query: str,
    headers: dict[str, str],
    body: bytes,
    send: Send,
    budget: Budget,
    call_id: int,
    disconnected: Callable[[], bool],
    allow_web_search: bool = False,
    own_responses: set[str] | None = None,
) -> CallResult:
    """Send one call upstream and its answer back; what happened, for the transcript and the meter.
    `own_responses` collects the ids of the Responses this run created (and may continue)."""
    t0 = time.monotonic()
    is_responses = upstream.provider == "openai" and path == "/v1/responses"
    meter = responses.ResponsesMeter() if is_responses else meter_for(upstream.provider)
    head: RequestHead | responses.ResponsesHead | None
    try:
        # Only the fields the gateway reads: an agent's request is often megabytes of context.
        head = (responses.RESPONSES_HEAD if is_responses else _REQUEST_HEAD).decode(body or b"{}")
    except msgspec.DecodeError:
        head = None
    model = head.model if head is not None and isinstance(head.model, str) else ""
    stream = head is not None and head.stream is True
    result = CallResult(status=0, model=model or upstream.model, stream=stream, meter=meter)

    def done(status: int, error: str = "") -> CallResult:
        result.status, result.error = status, error
        result.latency_ms = int((time.monotonic() - t0) * 1000)
        result.model = model or meter.model or upstream.model
        return result

    if not budget.left():
        text = f"forgehand: the run's {budget.text}"
        await send_json(send, 403, error_body(upstream.provider, 403, "permission_error", text), _BUDGET)
        budget.cut()
        return done(403, text)
    if head is None:
        text = "the request body is not a JSON object"
        await send_json(send, 400, error_body(upstream.provider, 400, "invalid_request_error", text))
        return done(400, text)
    if isinstance(head, responses.ResponsesHead):
        refused = responses.refusal(head, allow_web_search=allow_web_search, own_responses=own_responses or set())
        if refused:
            text = f"forgehand: {refused}; nothing was sent to the provider"
            await send_json(send, 403, error_body("openai", 403, "permission_error", text), _REFUSED)
            return done(403, text)
    elif refused := network_refusal(head):
        text = f"forgehand: {refused} would reach the network from the provider's side; the sandbox has no network"
        await send_json(send, 400, error_body(upstream.provider, 400, "invalid_request_error", text))
        return done(400, text)
    if not budget.admit(call_id, len(body)):
        text = "forgehand: the calls in flight may spend the rest of the run's token budget; retry when they end"
        await send_json(send, 429, error_body(upstream.provider, 429, "rate_limit_error", text), _RESERVED)
        return done(429, text)
    request = client.build_request(
        "POST", upstream.url(path, query), headers=upstream.headers(headers), content=body, timeout=upstream.timeout
    )
    try:
        status, error = await _exchange(client, request, upstream, send, budget, call_id, meter, result, disconnected)
    finally:
        budget.release(call_id)  # a call that ended before it settled (an error, the agent gone)
    if isinstance(meter, responses.ResponsesMeter) and meter.response_id and own_responses is not None:
        own_responses.add(meter.response_id)
    return done(status, error)


async def _exchange(
    client: httpx.AsyncClient,
    request: httpx.Request,
    upstream: Upstream,
    send: Send,
    budget: Budget,
    call_id: int,
    meter: Meter,
    result: CallResult,
    disconnected: Callable[[], bool],
) -> tuple[int, str]:
    """The call upstream and its answer passed back: (the status the agent got, what went wrong)."""
    t0 = time.monotonic()
    try:
        resp = await client.send(request, stream=True)
    except httpx.TransportError as exc:  # timeouts and refused addresses included
        return await _upstream_failed(send, upstream, exc, started=False)
    chunks: BodyChunks | None = None
    try:
        result.ttfb_ms = int((time.monotonic() - t0) * 1000)
        is_sse = resp.headers.get("content-type", "").startswith("text/event-stream")
        if not is_sse:
            data = b""
            try:
                async for piece in resp.aiter_raw():
                    data += piece
                    if len(data) > MAX_JSON_ANSWER_BYTES:
                        raise httpx.ReadError("the answer is too large")
            except httpx.TransportError as exc:
                return await _upstream_failed(send, upstream, exc, started=True)
            if resp.status_code == 200:
                meter.finish_json(data)
            else:
                meter.error = data[:500].decode("utf-8", "replace")
            await send_json(send, resp.status_code, data, _answer_headers(resp))
            budget.settle(call_id, meter.estimated_total, input_known=meter.input_known or resp.status_code != 200)
            return resp.status_code, "" if resp.status_code == 200 else f"upstream {resp.status_code}"
        await send({"type": "http.response.start", "status": resp.status_code, "headers": _answer_headers(resp)})
        cut = False
        over = None
        if budget.limit:

            def over() -> bool:
                return budget.stream_over(call_id, meter.estimated_total)

        chunks = BodyChunks(resp)
        try:
            # The bytes pass as they came, by whole events; the meter reads them on the side.
            while (got := await chunks.next()) is not None:
                out, cut = meter.feed(got, over)
                if cut:
                    out += _stream_end(upstream.provider, meter)
                if out:
                    await send({"type": "http.response.body", "body": out, "more_body": True})
                if cut or disconnected():
                    break
            tail = meter.rest()
            if tail and not cut:
                await send({"type": "http.response.body", "body": tail, "more_body": True})
        except httpx.TimeoutException:
            text = f"the model endpoint stopped sending for {upstream.timeout:g} s: the stream was ended"
            await send({"type": "http.response.body", "body": _stream_error(upstream.provider, meter, text), **_MORE})
            meter.error = text
        except httpx.TransportError as exc:
            text = f"the model endpoint broke off the stream ({type(exc).__name__})"
            await send({"type": "http.response.body", "body": _stream_error(upstream.provider, meter, text), **_MORE})
            meter.error = text
        await send({"type": "http.response.body", "body": b""})
        budget.settle(call_id, meter.estimated_total, input_known=meter.input_known or resp.status_code != 200)
        if cut:
            budget.cut()
            return resp.status_code, f"{budget.text}: the stream was cut"
        return resp.status_code, meter.error
    finally:
        if chunks is not None:
            await chunks.close()
        await resp.aclose()
