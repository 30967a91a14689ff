"""The async face of the Docker engine: start sandboxes (the started ones are box.Sandbox).

Every Docker SDK call runs in the engine's own thread pool (never on the event loop) and is bounded
by a timeout, both in the HTTP client and around the awaiting coroutine.
"""

import asyncio
import contextlib
import functools
import re
import secrets
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import docker
import docker.errors
import requests.exceptions

from .box import Sandbox
from .commands import (
    ExecResult,
    ExecStream,
)
from .creation import InFlight
from .errors import EngineUnavailable, SpecRefused
from .hosts import ensure_hosts_file
from .images.agents_image import DEFAULT_AGENTS_IMAGE, build_agents_image, require_agent
from .images.building import BuildResult
from .images.sandbox_image import DEFAULT_IMAGE, build_image, image_is_current
from .owner import current_owner
from .process import SandboxProcess
from .pump import OutputChunk
from .relays import start_relays
from .spec import SandboxSpec, container_create_kwargs, without_docker_network

T = TypeVar("T")

_NAME_CHARS = re.compile(r"[^A-Za-z0-9_.-]+")


def _is_connection_error(exc: BaseException) -> bool:
    if isinstance(exc, requests.exceptions.ConnectionError | ConnectionError | FileNotFoundError):
        return True
    # docker-py wraps a failed version probe or a missing socket in a bare DockerException.
    return isinstance(exc, docker.errors.DockerException) and not isinstance(exc, docker.errors.APIError)


class SandboxEngine:
    """A Docker engine that runs sandboxes. Cheap to construct; connects on first use."""

    def __init__(
        self,
        base_url: str | None = None,
        *,
        api_timeout: float = 30.0,
        max_workers: int = 32,
    ) -> None:
        self.base_url = base_url
        self.api_timeout = api_timeout
        self._max_workers = max_workers
        self._executor = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="forgehand-docker")
        self._client: docker.DockerClient | None = None
        self._client_lock = threading.Lock()
        self._in_flight = InFlight(self._executor, self._invoke)
        # Starts between their call and their return: past the creation (relays, the quota mount
        # check) a start still runs commands on the engine and, failing, queues its removal.
        self._starts: set[asyncio.Future[None]] = set()

    async def __aenter__(self) -> "SandboxEngine":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self, *, grace: float | None = None) -> None:
        """Abandon creations in flight and wait (bounded by `grace`, default api_timeout) for them.

        A creating thread cannot be interrupted; abandoned, it removes what it made (creation.py).
        Only then does the client close.
        """
        limit = self.api_timeout if grace is None else grace
        await self._in_flight.drain(limit)
        # A start past its creation finds the engine closed at its next step and hands its container
        # to `remove_later`; shutting the pool down under it would leave that removal to a thread
        # nobody waits for (or to no thread at all).
        if starts := list(self._starts):
            await asyncio.wait(starts, timeout=limit)
        await self._in_flight.settle(limit)
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):
                await asyncio.get_running_loop().run_in_executor(self._executor, client.close)
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _get_client(self) -> docker.DockerClient:
        with self._client_lock:
            if self._client is None:
                timeout = max(1, int(self.api_timeout))
                try:
                    if self.base_url:
                        client = docker.DockerClient(
                            base_url=self.base_url, timeout=timeout, max_pool_size=self._max_workers
                        )
                    else:
                        client = docker.from_env(timeout=timeout, max_pool_size=self._max_workers)
                except docker.errors.DockerException as exc:
                    raise EngineUnavailable(f"no Docker engine answered: {exc}") from exc
                self._client = client
            return self._client

    def _invoke(self, fn: Callable[[docker.DockerClient], T]) -> T:
        client = self._get_client()
        try:
            return fn(client)
        except docker.errors.APIError:
            raise
        except Exception as exc:
            if _is_connection_error(exc):
                raise EngineUnavailable(f"no Docker engine answered: {exc}") from exc
            raise

    async def call(
        self,
        fn: Callable[[docker.DockerClient], T],
        *,
        timeout: float | None = None,  # noqa: ASYNC109 (bounds a thread, which no cancel scope can)
    ) -> T:
        """Run `fn(client)` in the engine's thread pool, bounded by `timeout` (default api_timeout)."""
        limit = self.api_timeout if timeout is None else timeout
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(self._executor, self._invoke, fn)
        try:
            # Not asyncio.wait_for, which on 3.11 swallows a cancel arriving with the result.
            async with asyncio.timeout(limit):
                return await future
        except TimeoutError as exc:
            raise EngineUnavailable(f"the Docker engine did not answer within {limit:g}s") from exc

    async def ping(self) -> None:
        await self.call(lambda c: c.ping())

    async def image_ready(self, tag: str = DEFAULT_IMAGE) -> bool:
        """True when `tag` exists with the current recipe version (the default image) or at all."""
        if tag == DEFAULT_IMAGE:
            return await self.call(lambda c: image_is_current(c, tag)) is not None

        def exists(c: docker.DockerClient) -> bool:
            try:
                c.images.get(tag)
            except docker.errors.ImageNotFound:
                return False
            return True

        return await self.call(exists)

    async def ensure_image(self, tag: str = DEFAULT_IMAGE, *, force: bool = False) -> BuildResult:
        """`build_image` off the event loop (cached: fast when the image is current)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, lambda: build_image(tag, force=force, base_url=self.base_url))

    async def ensure_agents_image(self, tag: str = DEFAULT_AGENTS_IMAGE, *, force: bool = False) -> BuildResult:
        """`build_agents_image` off the event loop (cached; builds the plain image too if missing)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._executor, lambda: build_agents_image(tag, force=force, base_url=self.base_url)
        )

    async def require_agent(self, name: str, image: str = DEFAULT_AGENTS_IMAGE) -> str:
        """The version of agent `name` in `image`, or AgentMissing: call it before starting a sandbox."""
        return await require_agent(self, name, image)

    async def start(self, spec: SandboxSpec, *, name: str | None = None) -> "Sandbox":
        """Create and start a sandbox; its idle process runs until stop or the wall clock.

        Cancelled (or timed out, or the engine closed) at any point, it leaves no container
        behind (see creation.py).
        """
        if self._in_flight.closed:
            raise EngineUnavailable("the sandbox engine is closed")
        done = asyncio.get_running_loop().create_future()
        self._starts.add(done)
        try:
            return await self._start(spec, name)
        finally:
            self._starts.discard(done)
            done.set_result(None)

    async def _start(self, spec: SandboxSpec, name: str | None) -> "Sandbox":
        workspace = Path(spec.workspace)
        if not await asyncio.to_thread(workspace.is_dir):
            raise SpecRefused(f"workspace {str(workspace)!r} is not a directory on this host")
        name = name or _container_name(spec)
        kwargs = container_create_kwargs(spec, name=name, ipv6=host_has_ipv6())  # validates the spec first
        if without_docker_network(spec):
            await _write_hosts_file(spec)
        kwargs["labels"] = {**kwargs["labels"], **current_owner().labels()}
        # Measured before the container exists, so the host's wall clock ends no later than the
        # idle process's and the host, not the container's death, ends a command at the limit.
        started_at = time.monotonic()
        container_id = await self._in_flight.create(kwargs, timeout=self.api_timeout * 2)  # create + start
        sandbox: Sandbox | None = None
        try:
            if self._in_flight.closed:
                raise EngineUnavailable("the sandbox engine closed while the sandbox was being created")
            sandbox = Sandbox(self, container_id, name, spec, started_at=started_at)
            # Before any other exec: whatever runs in the container finds its relays listening.
            await start_relays(sandbox)
            if sandbox.workspace_quota == "mount":
                await sandbox.verify_workspace_mount()
            if self._in_flight.closed:
                raise EngineUnavailable("the sandbox engine closed while the sandbox was being started")
        except BaseException:
            if sandbox is not None:
                sandbox.cancel_wall_clock()
            self._in_flight.remove_later(container_id)
            raise
        return sandbox


@functools.cache
def host_has_ipv6() -> bool:
    """The kernel here has IPv6 (not booted with ipv6.disable=1): a container's net.ipv6 sysctls
    exist (asked for without it, runc would fail every start). The engine is taken to share this
    host's kernel, as the workspace's bind mount does. Looked at once: it is fixed at boot."""
    return Path("/proc/sys/net/ipv6").is_dir()


async def _write_hosts_file(spec: SandboxSpec) -> None:
    assert spec.hosts_file is not None
    try:
        await asyncio.to_thread(ensure_hosts_file, spec.hosts_file)
    except OSError as exc:
        raise SpecRefused(
            f"cannot write the sandbox's hosts file {str(spec.hosts_file)!r}: {exc.strerror or exc}",
            hint="its directory must be writable here and seen by the engine at the same path "
            "(a worker's runs: FORGEHAND_RUN_CHANNEL_DIR)",
        ) from exc


def _container_name(spec: SandboxSpec) -> str:
    stem = _NAME_CHARS.sub("-", f"forgehand-{spec.instance}-{spec.run}")[:100].strip("-.")
    return f"{stem}-{secrets.token_hex(3)}"


__all__ = ["ExecResult", "ExecStream", "OutputChunk", "Sandbox", "SandboxEngine", "SandboxProcess"]
