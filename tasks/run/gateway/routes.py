"""The HTTP side of a run's channel (`RunChannel`, tasks/run/gateway/channel.py): the ASGI app
on `gateway.sock`, the run-token check, the routes (model calls to `proxy.forward`, hook calls to
the runtime's handler, `/mcp` to the back-channel), the limits of hook and back-channel calls, and
one `model_call` transcript event per model call with what it used."""

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from forge.core.error_codes import Code
from tasks.core.transcript import Kind, ModelCall, Notice, Payload
from tasks.run.backchannel.mcp import MCP_PATH, serve_mcp
from tasks.run.gateway.answers import Send, error_body, send_json
from tasks.run.gateway.budget import Budget
from tasks.run.gateway.endpoint import Upstream
from tasks.run.gateway.limits import REFUSAL_PAUSE_SECONDS, CallLimiter, Refusal
from tasks.run.gateway.metering import PriceTable, Usage
from tasks.run.gateway.proxy import MAX_REQUEST_BYTES, CallResult, forward
from tasks.run.gateway.responses import Stored
from tasks.run.gateway.tokens import RunGrant, TokenRegistry
from tasks.run.gateway.upstream import UpstreamTransport

log = structlog.get_logger("forgehand.gateway")

# A hook's or back-channel call's body: one tool call's input (a file Write, a patch) or its
# output, which the CLIs cap far below this; beyond it the call is refused (413), and refused
# hooks deny.
MAX_CONTROL_BYTES = 8 * 1024 * 1024
HookHandler = Callable[[str, str, dict[str, Any]], Awaitable[dict[str, Any]]]
Emit = Callable[[Kind, Payload], Awaitable[None]]

# path -> (provider, API): the API is recorded on each call's transcript event.
_ROUTES = {
    "/v1/messages": ("anthropic", "messages"),
    "/v1/chat/completions": ("openai", "chat_completions"),
    "/v1/responses": ("openai", "responses"),
}


class ChannelRoutes:
    """The requests of `RunChannel` (what it holds, declared here)."""

    upstreams: dict[str, Upstream]
    provider: Any  # channel.ProviderInfo (channel.py imports this module)
    prices: PriceTable
    grant: RunGrant
    registry: TokenRegistry
    budget: Budget
    usage: Usage
    cost_micros: int | None
    calls: int
    endpoint_refused: asyncio.Event
    refusal: str
    stored: Stored
    control_calls: CallLimiter
    _limits_noted: set[str]
    _emit: Emit | None
    _hook: HookHandler | None
    _transport: UpstreamTransport | None
    _guarded: UpstreamTransport | None
    _active: set[asyncio.Task[Any]]
    _closed: bool

    def _authorized(self, headers: dict[str, str]) -> bool:
        auth = headers.get("authorization", "")
        candidates = [auth[7:].strip()] if auth[:7].lower() == "bearer " else []
        if "x-api-key" in headers:
            candidates.append(headers["x-api-key"].strip())
        return any(self.registry.allows(c, self.grant) for c in candidates if c)

    async def _app(self, scope: dict[str, Any], receive: Any, send: Send) -> None:
        if scope["type"] != "http":
            return
        task = asyncio.current_task()
        if task is not None:
            self._active.add(task)
        try:
            await self._handle(scope, receive, send)
        finally:
            if task is not None:
                self._active.discard(task)

    async def _handle(self, scope: dict[str, Any], receive: Any, send: Send) -> None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        path: str = scope["path"]
        provider, api = _ROUTES.get(path, ("anthropic", ""))
        if self._closed or not self._authorized(headers):
            message = "a valid run token is required (Authorization: Bearer or x-api-key)"
            await send_json(send, 401, error_body(provider, 401, "authentication_error", message))
            return
        if scope["method"] != "POST":
            await send_json(send, 405, error_body(provider, 405, "invalid_request_error", "POST only"))
            return
        control = path == MCP_PATH or path.startswith("/hooks/")
        if control and (refusal := self.control_calls.take()):
            await self._control_refused(refusal, send)  # before its body is read
            return
        # A model call may carry a long conversation; a hook or back-channel call is one tool's
        # input and output. With 16 connections per run, the smaller cap keeps what an agent can
        # make the worker hold far below 16 x MAX_REQUEST_BYTES on those paths.
        limit = MAX_CONTROL_BYTES if control else MAX_REQUEST_BYTES
        buffer = bytearray()  # bytes += bytes is quadratic: an agent could stall the event loop
        more = True
        while more:
            message_in = await receive()
            if message_in["type"] == "http.disconnect":
                return
            buffer += message_in.get("body", b"")
            more = message_in.get("more_body", False)
            if len(buffer) > limit:
                await send_json(send, 413, error_body(provider, 413, "request_too_large", "the request is too large"))
                return
        body = bytes(buffer)
        if path == MCP_PATH:  # the agent back-channel (tasks/run/backchannel), POST only
            await serve_mcp(self, headers, body, send)
        elif path.startswith("/hooks/"):
            await self._hook_call(path, body, send)
        elif api:
            await self._model_call(provider, api, scope, headers, body, receive, send)
        else:
            await send_json(send, 404, error_body(provider, 404, "not_found_error", f"no route {path}"))

    async def _control_refused(self, refusal: Refusal, send: Send) -> None:
        """429 for a hook or back-channel call past the run's limits, after a short pause (a
        flood over the run's few connections stays a trickle); the first of each kind is noted
        in the transcript, the rest only counted."""
        text = "forgehand: " + self.control_calls.describe(refusal)
        if refusal not in self._limits_noted:
            self._limits_noted.add(refusal)
            log.warning("a run's channel limit was reached", run_uuid=self.grant.run_uuid, limit=refusal)
            if self._emit is not None:
                try:
                    await self._emit("notice", Notice(text=text + " (429)", level="warning"))
                except Exception:
                    log.warning("the channel limit's transcript event was lost", exc_info=True)
        await asyncio.sleep(REFUSAL_PAUSE_SECONDS)
        headers = [(b"retry-after", str(self.control_calls.retry_after()).encode())] if refusal == "rate" else []
        body = json.dumps({"error": text, "code": Code.RUN_CHANNEL_LIMITED.value}).encode()
        await send_json(send, 429, body, headers)

    async def _hook_call(self, path: str, body: bytes, send: Send) -> None:
        parts = path.split("/")
        if len(parts) != 4 or not parts[2] or not parts[3]:
            await send_json(send, 404, json.dumps({"error": "expected /hooks/{agent}/{event}"}).encode())
            return
        handler = self._hook
        if handler is None:
            await send_json(send, 503, json.dumps({"error": "no hook handler"}).encode())
            return
        try:
            data = json.loads(body or b"{}")
        except ValueError:
            data = None
        if not isinstance(data, dict):
            await send_json(send, 400, json.dumps({"error": "the hook body is not a JSON object"}).encode())
            return
        try:
            answer = await handler(parts[2], parts[3], data)
        except Exception as exc:
            log.exception("a hook handler failed", path=path)
            await send_json(send, 500, json.dumps({"error": f"the hook handler failed: {type(exc).__name__}"}).encode())
            return
        await send_json(send, 200, json.dumps(answer).encode())

    async def _model_call(
        self,
        provider: str,
        api: str,
        scope: dict[str, Any],
        headers: dict[str, str],
        body: bytes,
        receive: Any,
        send: Send,
    ) -> None:
        upstream = self.upstreams.get(provider)
        if upstream is None or not upstream.base_url:
            text = f"no {provider} model endpoint is configured for this run"
            await send_json(send, 503, error_body(provider, 503, "api_error", text))
            return
        transport = self._guarded if upstream.guarded else self._transport
        assert transport is not None
        self.calls += 1
        result = await self._forward(transport, upstream, self.calls, scope, headers, body, receive, send)
        if result.endpoint_refused and not self.endpoint_refused.is_set():
            self.refusal = result.error
            self.endpoint_refused.set()
        usage = result.meter.usage
        if not result.meter.final_output:
            usage.output_tokens = max(usage.output_tokens, result.meter.estimated_total - usage.total)
        cost = self.prices.cost_micros(result.model, usage) if usage.total else 0
        self._add(usage, cost)
        await self._record_call(provider, api, result, usage, cost)

    async def _forward(
        self,
        transport: UpstreamTransport,
        upstream: Upstream,
        call_id: int,
        scope: dict[str, Any],
        headers: dict[str, str],
        body: bytes,
        receive: Any,
        send: Send,
    ) -> CallResult:
        """The call forwarded on its upstream's transport (the guarded one for an endpoint the
        operator did not choose) while the agent's disconnect is watched for."""
        gone = asyncio.Event()

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            gone.set()

        watcher = asyncio.ensure_future(watch())
        try:
            return await forward(
                transport,
                upstream,
                path=scope["path"],
                query=scope.get("query_string", b"").decode("latin-1"),
                headers=headers,
                body=body,
                send=send,
                budget=self.budget,
                call_id=call_id,
                disconnected=gone.is_set,
                allow_web_search=self.provider.allow_web_search,
                stored=self.stored,
                prices=self.prices,
            )
        finally:
            watcher.cancel()

    async def _record_call(self, provider: str, api: str, result: CallResult, usage: Usage, cost: int | None) -> None:
        """The call's `model_call` transcript event (a lost one is logged, never fails the call)."""
        if self._emit is None:
            return
        event = ModelCall(
            provider=provider,
            api=api,
            model=result.model,
            status=result.status,
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            cache_read_tokens=usage.cache_read_tokens,
            cache_write_tokens=usage.cache_write_tokens,
            latency_ms=result.latency_ms,
            ttfb_ms=result.ttfb_ms,
            cost_usd=None if cost is None else cost / 1_000_000,
            stream=result.stream,
            error=result.error,
        )
        try:
            await self._emit("model_call", event)
        except Exception:
            log.warning("the model call's transcript event was lost", exc_info=True)

    def _add(self, usage: Usage, cost: int | None) -> None:
        total = self.usage
        total.input_tokens += usage.input_tokens
        total.output_tokens += usage.output_tokens
        total.cache_read_tokens += usage.cache_read_tokens
        total.cache_write_tokens += usage.cache_write_tokens
        self.cost_micros = None if cost is None or self.cost_micros is None else self.cost_micros + cost
