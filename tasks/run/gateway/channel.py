"""A run's channel to forgehand: its socket directory on the host (mounted read-only at
/run/forgehand in the sandbox) and the HTTP server on `gateway.sock` that answers the agent
(model calls, hook callbacks), owned by the worker process that runs the run.

The server is uvicorn bound to the run's Unix socket, serving a small ASGI app written here:
uvicorn brings a proven HTTP/1.1 implementation (keep-alive, chunked bodies, flow control) that
this module should not re-implement, and a bare ASGI callable adds next to nothing per request
(the gateway's overhead budget is 1.1x + 2 ms). Its signal handling is turned off: the process
belongs to the worker (or `serve`), whose own handlers must keep working."""

import asyncio
import contextlib
import json
import os
import shutil
import socket
import stat
import time
from collections.abc import Awaitable, Callable, Generator
from pathlib import Path
from typing import Any, Literal

import msgspec
import structlog
import uvicorn

from forge.core.error_codes import Code
from forge.core.urlguard import AllowList, AllowSource
from sandbox import CHANNEL_DIR
from tasks.core.transcript import Kind, ModelCall, Notice, Payload
from tasks.run.backchannel.mcp import MCP_PATH, serve_mcp
from tasks.run.gateway.budget import Budget
from tasks.run.gateway.guard import guarded_transport
from tasks.run.gateway.limits import REFUSAL_PAUSE_SECONDS, CallLimiter, CallLimits, Refusal
from tasks.run.gateway.metering import EMPTY_PRICES, PriceTable, Usage
from tasks.run.gateway.proxy import MAX_REQUEST_BYTES, Send, Upstream, error_body, forward, send_json
from tasks.run.gateway.responses import Stored
from tasks.run.gateway.tokens import REGISTRY, RunGrant, TokenRegistry
from tasks.run.gateway.upstream import UpstreamTransport

log = structlog.get_logger("forgehand.gateway")

SOCKET_NAME = "gateway.sock"
# A hook's or back-channel call's body: one tool call's input (a file Write, a patch) or its
# output, which the CLIs cap far below this; beyond it the call is refused (413), and refused
# hooks deny.
MAX_CONTROL_BYTES = 8 * 1024 * 1024
HookHandler = Callable[[str, str, dict[str, Any]], Awaitable[dict[str, Any]]]
Emit = Callable[[Kind, Payload], Awaitable[None]]
KeySource = Literal["instance", "repository", "personal"]

# path -> (provider, API): the API is recorded on each call's transcript event.
_ROUTES = {
    "/v1/messages": ("anthropic", "messages"),
    "/v1/chat/completions": ("openai", "chat_completions"),
    "/v1/responses": ("openai", "responses"),
}


class ProviderInfo(msgspec.Struct, frozen=True, kw_only=True):
    """Which models the run's agent is told to use, and whose key pays for its calls."""

    anthropic_model: str = ""
    openai_model: str = ""
    model_key: KeySource = "instance"
    provider: str = "openai"  # the provider the run's runtime speaks (recorded on the run)
    # The repository lets the provider search the web for the agent (Responses' hosted
    # `web_search` tool); runtimes turn their agent's web search on only then.
    allow_web_search: bool = False


def channel_name(run_uuid: str) -> str:
    return run_uuid.replace("-", "")[:16]


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield  # the worker's (or `serve`'s) signal handlers stay in charge


def check_channel_root(root: Path) -> None:
    """The directory that holds this instance's run socket directories must be ours and writable
    by nobody else, and so must the root it is in (FORGEHAND_RUN_CHANNEL_DIR, shared by the
    instances on the host): whoever can replace a run's directory, or the instance's, (a symlink,
    their own socket) gets the run's token and answers its hooks. The default is under the shared
    temporary directory, whose sticky bit keeps others from replacing what is ours in it."""
    for directory in (root, root.parent):
        info = directory.lstat()
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
            if directory == root.parent and _keeps_ours(info):
                continue
            raise PermissionError(
                f"the run channel directory {directory} must be a directory owned by this process's user and "
                "writable by nobody else (FORGEHAND_RUN_CHANNEL_DIR)"
            )


def _keeps_ours(info: os.stat_result) -> bool:
    """A directory where nobody else can replace what this user made (root's, and sticky where
    others may write: /tmp), above the channel root."""
    return (
        stat.S_ISDIR(info.st_mode)
        and info.st_uid in (0, os.geteuid())
        and (not info.st_mode & 0o022 or bool(info.st_mode & stat.S_ISVTX))
    )


class RunChannel:
    container_dir = CHANNEL_DIR
    container_socket = f"{CHANNEL_DIR}/{SOCKET_NAME}"

    def __init__(
        self,
        *,
        root: Path,
        task_id: int,
        run_id: int,
        run_uuid: str,
        upstreams: dict[str, Upstream],
        provider: ProviderInfo,
        token_budget: int = 0,
        prices: PriceTable = EMPTY_PRICES,
        emit: Emit | None = None,
        registry: TokenRegistry = REGISTRY,
        allowed_hosts: AllowList | AllowSource | None = None,
        call_limits: CallLimits | None = None,
    ) -> None:
        self.host_dir = root / channel_name(run_uuid)
        self.socket_path = self.host_dir / SOCKET_NAME
        self.provider = provider
        self.upstreams = upstreams
        self.prices = prices
        self.grant = RunGrant(task_id=task_id, run_id=run_id, run_uuid=run_uuid)
        self.registry = registry
        self.token = registry.issue(task_id, run_id, run_uuid)
        self.budget = Budget(token_budget)
        self.budget_exhausted = self.budget.exhausted
        self.usage = Usage()
        self.cost_micros: int | None = 0
        self.calls = 0
        # The URL guard refused the run's endpoint: the first refusal's text, for the run's error.
        self.endpoint_refused = asyncio.Event()
        self.refusal = ""
        self.allowed_hosts: AllowList | AllowSource = allowed_hosts or AllowList()
        self.stored = Stored()  # what this run's Responses calls created on the provider's side
        # Hook and back-channel calls: a rate and a cap (limits.py); each limit reached is noted once.
        self.control_calls = CallLimiter(call_limits or CallLimits())
        self._limits_noted: set[str] = set()
        self._emit = emit
        self._hook: HookHandler | None = None
        self._server: _Server | None = None
        self._serving: asyncio.Task[None] | None = None
        self._transport: UpstreamTransport | None = None
        self._guarded: UpstreamTransport | None = None  # for endpoints the operator did not choose
        self._active: set[asyncio.Task[Any]] = set()
        self._warming: set[asyncio.Future[None]] = set()
        self._closed = False

    # --- what runtimes and the execution use ---------------------------------------------------

    def set_hook_handler(self, fn: HookHandler | None) -> None:
        self._hook = fn

    def set_emit(self, fn: Emit | None) -> None:
        self._emit = fn

    @property
    def cost_usd(self) -> float | None:
        return None if self.cost_micros is None else self.cost_micros / 1_000_000

    async def start(self) -> None:
        self.host_dir.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        check_channel_root(self.host_dir.parent)
        if self.host_dir.exists():  # a stale directory of a crashed worker (run uuids are unique)
            shutil.rmtree(self.host_dir, ignore_errors=True)
        self.host_dir.mkdir(mode=0o755)
        self.host_dir.chmod(0o755)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(str(self.socket_path))
        # Any uid may connect (the sandbox user is not ours); only this run's container sees the
        # directory, and the token is the second lock.
        self.socket_path.chmod(0o666)
        sock.listen(128)
        sock.setblocking(False)
        self._transport = UpstreamTransport()
        if any(u.guarded for u in self.upstreams.values()):
            self._guarded = guarded_transport(self.allowed_hosts)
        config = uvicorn.Config(
            self._app,
            lifespan="off",
            interface="asgi3",
            proxy_headers=False,
            log_config=None,
            access_log=False,
            timeout_keep_alive=120,
            timeout_graceful_shutdown=2,
            server_header=False,
            date_header=False,
            # An agent opening many calls at once gets 503s, not the worker's whole event loop.
            limit_concurrency=16,
        )
        # The endpoint's connection opened while the sandbox starts, not on the agent's first call.
        for upstream in self.upstreams.values():
            transport = self._guarded if upstream.guarded else self._transport
            if upstream.base_url and transport is not None:
                self._warming.add(asyncio.ensure_future(self._preconnect(transport, upstream)))
        self._server = _Server(config)
        self._serving = asyncio.ensure_future(self._server.serve(sockets=[sock]))
        deadline = time.monotonic() + 10
        while not self._server.started:
            if self._serving.done() or time.monotonic() > deadline:
                await self.close()
                raise RuntimeError(f"the run's gateway did not start on {self.socket_path}")
            await asyncio.sleep(0.005)

    async def close(self) -> None:
        """Revoke the token, end every call still open, stop the server, remove the directory."""
        if self._closed:
            return
        self._closed = True
        self.registry.revoke(self.token)
        self.registry.revoke_run(self.grant)
        for task in [*self._active, *self._warming]:
            task.cancel()
        if self._server is not None and self._serving is not None:
            self._server.should_exit = True
            try:
                async with asyncio.timeout(10):
                    await asyncio.shield(self._serving)
            except (TimeoutError, Exception):
                self._serving.cancel()
                log.warning("the run's gateway did not stop in time", socket=str(self.socket_path))
        for transport in (self._transport, self._guarded):
            if transport is not None:
                await transport.aclose()
        await asyncio.to_thread(shutil.rmtree, self.host_dir, True)
        if any(self.control_calls.refused.values()):
            log.warning(
                "the run's channel refused hook and back-channel calls over its limits",
                run_uuid=self.grant.run_uuid,
                let_through=self.control_calls.calls,
                **{f"refused_{k}": v for k, v in self.control_calls.refused.items()},
            )

    async def _preconnect(self, transport: UpstreamTransport, upstream: Upstream) -> None:
        try:
            await transport.preconnect(upstream.url("/v1/messages", ""), upstream.timeout)
        except Exception as exc:  # the first call connects (and reports) on its own
            log.debug("the model endpoint could not be reached ahead of the first call", error=str(exc))
        finally:
            self._warming.discard(asyncio.current_task())

    # --- the HTTP side ------------------------------------------------------------------------

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
        call_id = self.calls
        gone = asyncio.Event()

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            gone.set()

        watcher = asyncio.ensure_future(watch())
        try:
            result = await forward(
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
        if result.endpoint_refused and not self.endpoint_refused.is_set():
            self.refusal = result.error
            self.endpoint_refused.set()
        usage = result.meter.usage
        if not result.meter.final_output:
            usage.output_tokens = max(usage.output_tokens, result.meter.estimated_total - usage.total)
        cost = self.prices.cost_micros(result.model, usage) if usage.total else 0
        self._add(usage, cost)
        if self._emit is not None:
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
