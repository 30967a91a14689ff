"""A run's channel to forgehand: its socket directory on the host (mounted read-only at
/run/forgehand in the sandbox) and the HTTP server on `gateway.sock` that answers the agent
(model calls, hook callbacks), owned by the worker process that runs the run.

The server is uvicorn bound to the run's Unix socket, serving a small ASGI app (`routes.py`):
uvicorn brings a proven HTTP/1.1 implementation (keep-alive, chunked bodies, flow control) that
this module should not re-implement, and a bare ASGI callable adds next to nothing per request
(the gateway's overhead budget is 1.1x + 2 ms). Its signal handling is turned off: the process
belongs to the worker (or `serve`), whose own handlers must keep working."""

import asyncio
import contextlib
import os
import shutil
import socket
import stat
import time
from collections.abc import Generator
from pathlib import Path
from typing import Any, Literal

import msgspec
import structlog
import uvicorn

from forge.core.urlguard import AllowList, AllowSource
from sandbox import CHANNEL_DIR
from tasks.run.gateway.budget import Budget
from tasks.run.gateway.endpoint import Upstream
from tasks.run.gateway.guard import guarded_transport
from tasks.run.gateway.limits import CallLimiter, CallLimits
from tasks.run.gateway.metering import EMPTY_PRICES, PriceTable, Usage
from tasks.run.gateway.responses import Stored
from tasks.run.gateway.routes import ChannelRoutes, Emit, HookHandler
from tasks.run.gateway.tokens import REGISTRY, RunGrant, TokenRegistry
from tasks.run.gateway.upstream import UpstreamTransport

log = structlog.get_logger("forgehand.gateway")

SOCKET_NAME = "gateway.sock"
KeySource = Literal["instance", "repository", "personal"]


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


class RunChannel(ChannelRoutes):
    """A run's channel: its directory, socket and server, its token, what its calls used."""

    provider: ProviderInfo
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
