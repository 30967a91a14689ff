"""The answer to an agent's model call: the gateway's own (`error_body` in the provider's shape,
`send_json`), the upstream's passed back whole (`pass_json`) or as a stream (`pass_stream`: by
whole events, metered on the side, cut for the budget and ended as the provider ends one), and
the 502/504/403 of an endpoint that cannot be reached or is refused (`upstream_failed`)."""

import json
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from forge.core.error_codes import Code
from tasks.run.gateway import responses
from tasks.run.gateway.budget import GATEWAY_HEADER, Budget
from tasks.run.gateway.endpoint import Upstream
from tasks.run.gateway.guard import EndpointRefused
from tasks.run.gateway.metering import Meter
from tasks.run.gateway.upstream import Answer

MAX_JSON_ANSWER_BYTES = 64 * 1024 * 1024

Send = Callable[[dict[str, Any]], Awaitable[None]]

_PASS_ANSWER_PREFIXES = (b"anthropic-", b"x-ratelimit-", b"openai-")
_PASS_ANSWER = {b"content-type", b"retry-after", b"request-id", b"x-request-id", b"cache-control"}

_MORE = {"more_body": True}
_TIMEOUT = [(GATEWAY_HEADER.encode(), b"timeout")]
_UNREACHABLE = [(GATEWAY_HEADER.encode(), b"unreachable")]
REFUSED = [(GATEWAY_HEADER.encode(), b"refused")]
# The Anthropic and OpenAI SDKs (and the CLIs built on them) read `x-should-retry` before the status.
_ENDPOINT_REFUSED = [*REFUSED, (b"x-should-retry", b"false")]


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


async def upstream_failed(send: Send, upstream: Upstream, exc: Exception, *, started: bool) -> tuple[int, str]:
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


async def pass_json(
    answer: Answer, upstream: Upstream, send: Send, budget: Budget, call_id: int, meter: Meter
) -> tuple[int, str]:
    """A whole (JSON) answer read, metered and charged, then passed back."""
    status = answer.status
    data = bytearray()
    try:
        ended = False
        while not ended:
            piece, ended = await answer.next()
            data += piece
            if len(data) > MAX_JSON_ANSWER_BYTES:
                raise httpx.ReadError("the answer is too large")
    except httpx.TransportError as exc:
        return await upstream_failed(send, upstream, exc, started=True)
    if status == 200:
        meter.finish_json(bytes(data))
    else:
        meter.error = data[:500].decode("utf-8", "replace")
    # Charged before the agent has the answer: a call it opens on reading it sees the cost.
    budget.settle(call_id, meter.estimated_total, input_known=meter.input_known or status != 200)
    await send_json(send, status, bytes(data), _answer_headers(answer))
    return status, "" if status == 200 else f"upstream {status}"


async def pass_stream(
    answer: Answer,
    upstream: Upstream,
    send: Send,
    budget: Budget,
    call_id: int,
    meter: Meter,
    disconnected: Callable[[], bool],
) -> tuple[int, str]:
    """A stream passed back as it comes, metered on the side, cut at an event boundary when the
    budget is spent (and ended as the provider ends one), ended with an error event when the
    endpoint stops sending or breaks off."""
    status = answer.status
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
