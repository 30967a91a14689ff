"""Forwarding one model call upstream: Anthropic Messages, OpenAI chat completions and OpenAI
Responses (tasks/run/gateway/responses.py), with the real key injected on the host (endpoint.py),
the answer streamed back chunk by chunk as it arrives (answers.py), its usage metered, and the
run's token budget enforced (budget.py; a stream is cut at an event boundary and ended the way the provider ends
one, so the client sees a finished answer, never a hang).

Upstream trouble reaches the agent as the provider would say it: the upstream's own status and
body (429 with Retry-After, 500...), or a 502/504 in the provider's error shape when the endpoint
cannot be reached or does not answer in time (`x-forgehand-gateway: unreachable|timeout`). An
endpoint the URL guard refuses (tasks/run/gateway/guard.py) is answered 403 `permission_error`
(`gateway_endpoint_refused`, `x-forgehand-gateway: refused`, `x-should-retry: false`): a status the
agents' CLIs do not retry, since every call would be refused alike (measured with Claude Code
2.1.332: one call; a 400 it sends twice more, each time without another beta); the channel records
it and the run fails once with that reason (tasks/run/supervise.py)."""

import time
from collections.abc import Callable

import httpx
import msgspec

from forge.core.error_codes import Code
from tasks.run.gateway import responses
from tasks.run.gateway.answers import REFUSED, Send, error_body, pass_json, pass_stream, send_json, upstream_failed
from tasks.run.gateway.budget import GATEWAY_HEADER, Budget
from tasks.run.gateway.endpoint import Upstream
from tasks.run.gateway.guard import EndpointRefused
from tasks.run.gateway.metering import EMPTY_PRICES, Meter, PriceTable, meter_for
from tasks.run.gateway.request import ModelRequest, Refused, declared_max_output, network_refusal, pinned_model
from tasks.run.gateway.upstream import UpstreamTransport

MAX_REQUEST_BYTES = 32 * 1024 * 1024  # Anthropic's own request limit

_BUDGET = [(GATEWAY_HEADER.encode(), b"budget")]
_RESERVED = [(GATEWAY_HEADER.encode(), b"budget-reserved"), (b"retry-after", b"1")]


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


class _Answered(Exception):
    """The gateway answered the call itself (a refusal): nothing went upstream."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status, self.text = status, text


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

    try:
        request = await _admit(upstream, body, send, budget, call_id, is_responses, allow_web_search, stored, prices)
    except _Answered as answered:
        return done(answered.status, answered.text)
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


async def _admit(
    upstream: Upstream,
    body: bytes,
    send: Send,
    budget: Budget,
    call_id: int,
    is_responses: bool,
    allow_web_search: bool,
    stored: responses.Stored | None,
    prices: PriceTable,
) -> ModelRequest:
    """The request as it may go upstream, unless the run's budget is spent or the request is
    refused: then the agent is answered here and `_Answered` says how."""
    if not budget.left():
        text = f"forgehand: the run's {budget.text}"
        await send_json(send, 403, error_body(upstream.provider, 403, "permission_error", text), _BUDGET)
        budget.cut()
        raise _Answered(403, text)
    try:
        return _checked(upstream, body, is_responses, allow_web_search, stored or responses.Stored(), prices)
    except Refused as refused:
        provider, answer = upstream.provider, refused.message
        headers_out = REFUSED if refused.status == 403 else None
        await send_json(
            send, refused.status, error_body(provider, refused.status, refused.kind, answer, refused.code), headers_out
        )
        raise _Answered(refused.status, answer) from None


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
    try:
        answer = await transport.open(url, upstream.headers(headers), body, upstream.timeout)
    except httpx.TransportError as exc:  # timeouts and refused addresses included
        result.endpoint_refused = isinstance(exc, EndpointRefused)
        return await upstream_failed(send, upstream, exc, started=False)
    try:
        result.ttfb_ms = int((time.monotonic() - t0) * 1000)
        if not answer.header(b"content-type").startswith(b"text/event-stream"):
            return await pass_json(answer, upstream, send, budget, call_id, result.meter)
        return await pass_stream(answer, upstream, send, budget, call_id, result.meter, disconnected)
    finally:
        await answer.aclose()
