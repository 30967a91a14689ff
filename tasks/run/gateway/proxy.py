"""Forwarding one model call upstream: Anthropic Messages, OpenAI chat completions and OpenAI
Responses (tasks/run/gateway/responses.py), with the real key injected here on the host, the
answer streamed back chunk by chunk as it arrives, its usage metered, and the run's token budget
enforced (budget.py; a stream is cut at an event boundary and ended the way the provider ends
one, so the client sees a finished answer, never a hang).

Upstream trouble reaches the agent as the provider would say it: the upstream's own status and
body (429 with Retry-After, 500...), or a 502/504 in the provider's error shape when the endpoint
cannot be reached or does not answer in time (`x-forgehand-gateway: unreachable|timeout`). An
endpoint the URL guard refuses (tasks/run/gateway/guard.py) is answered 403 `permission_error`
(`gateway_endpoint_refused`, `x-forgehand-gateway: refused`, `x-should-retry: false`): a status the
agents' CLIs do not retry, since every call would be refused alike (measured with Claude Code
2.1.332: one call; a 400 it sends twice more, each time without another beta); the channel records
it and the run fails once with that reason (tasks/run/supervise.py)."""

import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import msgspec

from forge.core.error_codes import Code
from tasks.run.gateway import responses
from tasks.run.gateway.budget import GATEWAY_HEADER, Budget
from tasks.run.gateway.guard import EndpointRefused
from tasks.run.gateway.metering import EMPTY_PRICES, Meter, PriceTable, meter_for
from tasks.run.gateway.request import ModelRequest, Refused, declared_max_output, network_refusal, pinned_model
from tasks.run.gateway.upstream import Answer, UpstreamTransport

MAX_REQUEST_BYTES = 32 * 1024 * 1024  # Anthropic's own request limit
MAX_JSON_ANSWER_BYTES = 64 * 1024 * 1024

Send = Callable[[dict[str, Any]], Awaitable[None]]

# Request headers an agent may pass on (the rest, its credentials first, stay here).
_PASS_REQUEST = {"anthropic-version", "anthropic-beta", "content-type", "accept", "user-agent", "openai-beta"}
# Anthropic betas that bill the same tokens at a premium (fast mode, the 1M-token context window):
# the budget counts tokens, so these would spend several times more within it.
_PREMIUM_BETAS = ("fast-mode-", "context-1m-")
_PASS_ANSWER_PREFIXES = (b"anthropic-", b"x-ratelimit-", b"openai-")
_PASS_ANSWER = {b"content-type", b"retry-after", b"request-id", b"x-request-id", b"cache-control"}


_MORE = {"more_body": True}
_TIMEOUT = [(GATEWAY_HEADER.encode(), b"timeout")]
_UNREACHABLE = [(GATEWAY_HEADER.encode(), b"unreachable")]
_BUDGET = [(GATEWAY_HEADER.encode(), b"budget")]
_RESERVED = [(GATEWAY_HEADER.encode(), b"budget-reserved"), (b"retry-after", b"1")]
_REFUSED = [(GATEWAY_HEADER.encode(), b"refused")]
# The Anthropic and OpenAI SDKs (and the CLIs built on them) read `x-should-retry` before the status.
_ENDPOINT_REFUSED = [*_REFUSED, (b"x-should-retry", b"false")]


def premium_betas_removed(betas: str) -> str:
    """An `anthropic-beta` header's value without the betas billed at a premium."""
    kept = [b.strip() for b in betas.split(",") if b.strip() and not b.strip().lower().startswith(_PREMIUM_BETAS)]
    return ",".join(kept)


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

    def headers(self, incoming: dict[str, str]) -> list[tuple[bytes, bytes]]:
        out = {k: v for k, v in incoming.items() if k in _PASS_REQUEST}
        if "anthropic-beta" in out:
            betas = premium_betas_removed(out.pop("anthropic-beta"))
            if betas:
                out["anthropic-beta"] = betas
        out["accept-encoding"] = "identity"  # the bytes are metered as they pass: no compression
        if self.api_key:
            if self.provider == "anthropic":
                out["x-api-key"] = self.api_key
                out.setdefault("anthropic-version", "2023-06-01")
            else:
                out["authorization"] = f"Bearer {self.api_key}"
        return [(k.encode("latin-1"), v.encode("latin-1")) for k, v in out.items()]


class CallResult(msgspec.Struct, kw_only=True):
    status: int
    model: str
    stream: bool
    meter: Meter
    latency_ms: int = 0
    ttfb_ms: int | None = None
    error: str = ""
    # The URL guard refused the endpoint (every call of the run would be refused alike).
    endpoint_refused: bool = False


def error_body(provider: str, status: int, kind: str, message: str, code: str = "") -> bytes:
    """The provider's error shape; `code` (a registered forge error code) says which of the
    gateway's own refusals it is (Anthropic's error object gains a `code` beside its `type`)."""
    if provider == "anthropic":
        error = {"type": kind, "message": message} | ({"code": code} if code else {})
        return json.dumps({"type": "error", "error": error}).encode()
    return json.dumps({"error": {"message": message, "type": kind, "code": code or kind}}).encode()


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


def _answer_headers(answer: Answer) -> list[tuple[bytes, bytes]]:
    out = []
    for key, value in answer.headers:
        k = key.lower()
        if k in _PASS_ANSWER or k.startswith(_PASS_ANSWER_PREFIXES):
            out.append((k, value))
    return out


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
    answer) in time: 502 or 504 in the provider's shape; 403 when the URL guard refused it."""
    if isinstance(exc, httpx.TimeoutException):
        what = "finish its answer" if started else "answer"
        status, kind, said = 504, "timeout_error", _TIMEOUT
        text = f"the model endpoint did not {what} within {upstream.timeout:g} s"
    elif isinstance(exc, EndpointRefused):
        text = f"forgehand refused the model endpoint {upstream.base_url}: {exc}; nothing was sent"
        body = error_body(upstream.provider, 403, "permission_error", text, Code.GATEWAY_ENDPOINT_REFUSED)
        await send_json(send, 403, body, _ENDPOINT_REFUSED)
        return 403, text
    else:
        status, kind, said = 502, "api_error", _UNREACHABLE
        text = "the model endpoint " + ("broke off its answer" if started else "is unreachable")
        text += f" ({type(exc).__name__})"
    await send_json(send, status, error_body(upstream.provider, status, kind, text), said)
    return status, text


async def forward(
    transport: UpstreamTransport,
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
    stored: responses.Stored | None = None,
    prices: PriceTable = EMPTY_PRICES,
) -> CallResult:
    """Send one call upstream and its answer back; what happened, for the transcript and the meter.
    `stored` collects what this run's Responses created on the provider's side (and may name)."""
    t0 = time.monotonic()
    is_responses = upstream.provider == "openai" and path == "/v1/responses"
    meter = responses.ResponsesMeter() if is_responses else meter_for(upstream.provider)
    result = CallResult(status=0, model=upstream.model, stream=False, meter=meter)

    def done(status: int, error: str = "") -> CallResult:
        result.status, result.error = status, error
        result.latency_ms = int((time.monotonic() - t0) * 1000)
        result.model = result.model or meter.model
        return result

    if not budget.left():
        text = f"forgehand: the run's {budget.text}"
        await send_json(send, 403, error_body(upstream.provider, 403, "permission_error", text), _BUDGET)
        budget.cut()
        return done(403, text)
    try:
        request = _checked(upstream, body, is_responses, allow_web_search, stored or responses.Stored(), prices)
    except Refused as refused:
        provider, answer = upstream.provider, refused.message
        headers_out = _REFUSED if refused.status == 403 else None
        await send_json(
            send, refused.status, error_body(provider, refused.status, refused.kind, answer, refused.code), headers_out
        )
        return done(refused.status, answer)
    result.model, result.stream = request.model, request.stream
    body = request.body()
    if not budget.admit(call_id, len(body), declared_max_output(request, responses_api=is_responses)):
        text = "forgehand: this call's input and maximum output do not fit in the run's token budget beside "
        text += "the calls in flight, which may spend the rest; retry when they end"
        refusal = error_body(upstream.provider, 429, "rate_limit_error", text, Code.GATEWAY_BUDGET_RESERVED)
        await send_json(send, 429, refusal, _RESERVED)
        return done(429, text)
    try:
        url = upstream.url(path, query)
        status, error = await _exchange(
            transport, url, body, headers, upstream, send, budget, call_id, result, disconnected
        )
    finally:
        budget.release(call_id)  # a call that ended before it settled (an error, the agent gone)
    if isinstance(meter, responses.ResponsesMeter) and stored is not None:
        stored.add(meter)
    return done(status, error)


def _checked(
    upstream: Upstream,
    body: bytes,
    is_responses: bool,
    allow_web_search: bool,
    stored: responses.Stored,
    prices: PriceTable,
) -> ModelRequest:
    """The request as it may go upstream (its model the run's), or Refused."""
    request = ModelRequest(body, items=is_responses)
    if is_responses:
        if refused := responses.refusal(request, allow_web_search=allow_web_search, stored=stored):
            raise Refused(403, Code.GATEWAY_REFUSED, f"forgehand: {refused}; nothing was sent to the provider")
    elif refused := network_refusal(request):
        text = f"forgehand: {refused} would reach the network from the provider's side; the sandbox has no network"
        raise Refused(400, Code.GATEWAY_NETWORK_TOOL, text)
    model = pinned_model(request.requested_model, upstream.model, prices)
    if model is None:
        text = f"forgehand: the model {request.requested_model!r} is not one this run may use "
        text += "(none is configured and the price table does not list it)"
        raise Refused(403, Code.GATEWAY_MODEL_REFUSED, text)
    request.model = model
    return request


async def _exchange(
    transport: UpstreamTransport,
    url: str,
    body: bytes,
    headers: dict[str, str],
    upstream: Upstream,
    send: Send,
    budget: Budget,
    call_id: int,
    result: CallResult,
    disconnected: Callable[[], bool],
) -> tuple[int, str]:
    """The call upstream and its answer passed back: (the status the agent got, what went wrong)."""
    t0 = time.monotonic()
    meter = result.meter
    try:
        answer = await transport.open(url, upstream.headers(headers), body, upstream.timeout)
    except httpx.TransportError as exc:  # timeouts and refused addresses included
        result.endpoint_refused = isinstance(exc, EndpointRefused)
        return await _upstream_failed(send, upstream, exc, started=False)
    try:
        result.ttfb_ms = int((time.monotonic() - t0) * 1000)
        status = answer.status
        if not answer.header(b"content-type").startswith(b"text/event-stream"):
            data = bytearray()
            try:
                ended = False
                while not ended:
                    piece, ended = await answer.next()
                    data += piece
                    if len(data) > MAX_JSON_ANSWER_BYTES:
                        raise httpx.ReadError("the answer is too large")
            except httpx.TransportError as exc:
                return await _upstream_failed(send, upstream, exc, started=True)
            if status == 200:
                meter.finish_json(bytes(data))
            else:
                meter.error = data[:500].decode("utf-8", "replace")
            # Charged before the agent has the answer: a call it opens on reading it sees the cost.
            budget.settle(call_id, meter.estimated_total, input_known=meter.input_known or status != 200)
            await send_json(send, status, bytes(data), _answer_headers(answer))
            return status, "" if status == 200 else f"upstream {status}"
        await send({"type": "http.response.start", "status": status, "headers": _answer_headers(answer)})
        cut = False
        over = None
        if budget.limit:

            def over() -> bool:
                return budget.stream_over(call_id, meter.estimated_total)

        finished = False  # the agent's side was ended along with the last piece
        try:
            # The bytes pass as they came, by whole events; the meter reads them on the side. The
            # last piece and the stream's end leave in one write.
            ended = False
            while not ended:
                got, ended = await answer.next()
                out, cut = meter.feed(got, over)
                if cut:
                    out += _stream_end(upstream.provider, meter)
                elif ended:
                    out += meter.rest()
                    finished = True
                    await send({"type": "http.response.body", "body": out})
                    break
                if out:
                    await send({"type": "http.response.body", "body": out, "more_body": True})
                if cut or disconnected():
                    break
        except httpx.TimeoutException:
            text = f"the model endpoint stopped sending for {upstream.timeout:g} s: the stream was ended"
            await send({"type": "http.response.body", "body": _stream_error(upstream.provider, meter, text), **_MORE})
            meter.error = text
        except httpx.TransportError as exc:
            text = f"the model endpoint broke off the stream ({type(exc).__name__})"
            await send({"type": "http.response.body", "body": _stream_error(upstream.provider, meter, text), **_MORE})
            meter.error = text
        if not finished:
            await send({"type": "http.response.body", "body": b""})
        budget.settle(call_id, meter.estimated_total, input_known=meter.input_known or status != 200)
        if cut:
            budget.cut()
            return status, f"{budget.text}: the stream was cut"
        return status, meter.error
    finally:
        await answer.aclose()
