"""The async face of the Docker engine: start sandboxes, exec in them, stop and remove them.

Every Docker SDK call runs in the engine's own thread pool (never on the event loop) and is bounded
by a timeout, both in the HTTP client and around the awaiting coroutine.
"""

import asyncio
import contextlib
import os
import re
import secrets
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import docker
import docker.errors
import requests.exceptions

from .creation import InFlight, remove_container
from .errors import EngineUnavailable, SandboxError, SandboxGone, SpecRefused
from .execution import (
    OOM_COUNTER,
    ExecResult,
    ExecStream,
    validate_argv,
    validate_exec_env,
)
from .image import DEFAULT_IMAGE, BuildResult, build_image, image_is_current
from .owner import current_owner
from .pump import OutputChunk
from .quota import QuotaKind, WorkspaceWatch
from .spec import WORKSPACE_DIR, SandboxSpec, container_create_kwargs

T = TypeVar("T")

_NAME_CHARS = re.compile(r"[^A-Za-z0-9_.-]+")
# The major:minor of the filesystem mounted at /workspace, with shell builtins only (a custom image
# need not have coreutils).
_WORKSPACE_DEVICE = (
    f'while read -r _ _ dev _ mnt _; do [ "$mnt" = {WORKSPACE_DIR} ] && echo "$dev"; done </proc/self/mountinfo'
)


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

    async def __aenter__(self) -> "SandboxEngine":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self, *, grace: float | None = None) -> None:
        """Abandon creations in flight and wait (bounded by `grace`, default api_timeout) for them.

        A creating thread cannot be interrupted; abandoned, it removes what it made (creation.py).
        Only then does the client close.
        """
        await self._in_flight.drain(self.api_timeout if grace is None else grace)
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
            return await asyncio.wait_for(future, limit)
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

    async def start(self, spec: SandboxSpec, *, name: str | None = None) -> "Sandbox":
        """Create and start a sandbox; its idle process runs until stop or the wall clock.

        Cancelled (or timed out, or the engine closed) at any point, it leaves no container
        behind (see creation.py).
        """
        if self._in_flight.closed:
            raise EngineUnavailable("the sandbox engine is closed")
        workspace = Path(spec.workspace)
        if not await asyncio.to_thread(workspace.is_dir):
            raise SpecRefused(f"workspace {str(workspace)!r} is not a directory on this host")
        name = name or _container_name(spec)
        kwargs = container_create_kwargs(spec, name=name)
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
            if sandbox.workspace_quota == "mount":
                await sandbox.verify_workspace_mount()
        except BaseException:
            if sandbox is not None:
                sandbox.cancel_wall_clock()
            self._in_flight.remove_later(container_id)
            raise
        return sandbox


def _container_name(spec: SandboxSpec) -> str:
    stem = _NAME_CHARS.sub("-", f"forgehand-{spec.instance}-{spec.run}")[:100].strip("-.")
    return f"{stem}-{secrets.token_hex(3)}"


class Sandbox:
    """A started sandbox. Use as `async with await engine.start(spec) as sb:` to remove it afterwards."""

    def __init__(
        self,
        engine: SandboxEngine,
        container_id: str,
        name: str,
        spec: SandboxSpec,
        *,
        started_at: float | None = None,
    ) -> None:
        self.engine = engine
        self.id = container_id
        self.name = name
        self.spec = spec
        self.started_at = time.monotonic() if started_at is None else started_at
        self.deadline = self.started_at + spec.limits.wall_clock_seconds
        self._oom_seen = 0  # a fresh cgroup starts at zero OOM kills
        self._removed = False
        # The idle process ends the container at the wall clock by itself; this host-side timer
        # also covers an idle process the agent managed to stop (SIGSTOP) or a host that is slow.
        self._wall_clock = asyncio.get_running_loop().create_task(self._enforce_wall_clock())
        self._workspace_watch = WorkspaceWatch(Path(spec.workspace), spec.limits.workspace_bytes)
        self._workspace_watch.start()

    async def __aenter__(self) -> "Sandbox":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.remove()

    @property
    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    @property
    def workspace_quota(self) -> QuotaKind:
        """What holds the workspace to its limit: its own filesystem ("mount") or the watchdog."""
        return self._workspace_watch.enforced_by

    @property
    def disk_limit_reached(self) -> bool:
        """The workspace was seen at its limit (sticky; looked at every quarter second on a mount)."""
        return self._workspace_watch.limit_reached

    async def check_disk_limit(self) -> bool:
        """Look at the workspace now (e.g. when the agent is done); True when it is or was at its limit."""
        try:
            return await self._workspace_watch.check()
        except OSError:
            return self._workspace_watch.limit_reached

    async def verify_workspace_mount(self) -> None:
        """Refuse a sandbox whose engine sees the directory under the quota mount, not the mount itself.

        An engine in another mount namespace (a dockerd with private mounts) would bind the empty
        directory below: writes would land on the host's disk with no limit at all.
        """
        dev = (await asyncio.to_thread(os.stat, self.spec.workspace)).st_dev
        try:
            code, out = await self.run_quiet(["/bin/sh", "-c", _WORKSPACE_DEVICE])
        except SandboxError:
            code, out = None, b""
        if code is None or out.split()[-1:] != [f"{os.major(dev)}:{os.minor(dev)}".encode()]:
            await self.remove()
            raise SpecRefused(
                "the engine does not see the workspace's quota mount (is dockerd in another mount namespace?)",
                hint="run dockerd in the host's mount namespace, or use the watchdog fallback",
            )

    async def engine_call(
        self,
        fn: Callable[[docker.DockerClient], T],
        *,
        timeout: float | None = None,  # noqa: ASYNC109 (see SandboxEngine.call)
        container: bool = False,
    ) -> T:
        """`engine.call`, with "no such container" / "not running" turned into SandboxGone."""
        try:
            return await self.engine.call(fn, timeout=timeout)
        except docker.errors.NotFound as exc:
            raise SandboxGone(f"sandbox {self.name} no longer exists") from exc
        except docker.errors.APIError as exc:
            if container and exc.status_code == 409:
                raise SandboxGone(f"sandbox {self.name} is not running: {exc.explanation}") from exc
            if container:
                raise SandboxError(f"the engine refused the command: {exc.explanation or exc}") from exc
            raise

    def stream(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str = WORKSPACE_DIR,
        stdin: bytes | None = None,
        timeout: float | None = None,
        output_cap: int | None = None,
        queue_chunks: int = 16,
        keep_background: bool = False,
    ) -> ExecStream:
        """Run argv; iterate the result for output chunks, then read `.result`.

        When the command exits, whatever it left running (background jobs, a fork bomb) is killed,
        unless `keep_background`; those then live until the sandbox stops.
        """
        if self._removed:
            raise SandboxGone(f"sandbox {self.name} was removed")
        remaining = self.remaining
        if remaining <= 0:
            raise SandboxGone(f"sandbox {self.name} passed its wall-clock limit")
        if not cwd.startswith("/") or "\x00" in cwd:
            raise SpecRefused(f"cwd must be an absolute container path, got {cwd!r}")
        limit = self.spec.limits.exec_timeout_seconds if timeout is None else timeout
        if limit <= 0:
            raise SpecRefused("timeout must be positive")
        cap = self.spec.limits.output_cap_bytes if output_cap is None else output_cap
        if cap < 0:
            raise SpecRefused("output_cap must not be negative")
        return ExecStream(
            self,
            validate_argv(argv),
            # The spec's env is in the container already, except for a pooled sandbox, made before
            # its task was known: passing it again with each command covers both.
            env=validate_exec_env({**self.spec.env, **(env or {})}),
            cwd=cwd,
            stdin=stdin,
            timeout=min(limit, remaining),
            output_cap=cap,
            queue_chunks=max(1, queue_chunks),
            keep_background=keep_background,
        )

    async def exec(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str = WORKSPACE_DIR,
        stdin: bytes | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 (the command's limit, enforced in the sandbox)
        output_cap: int | None = None,
        keep_background: bool = False,
    ) -> ExecResult:
        """Run argv to completion; stdout and stderr are collected up to the output cap."""
        out = bytearray()
        err = bytearray()
        async with self.stream(
            argv,
            env=env,
            cwd=cwd,
            stdin=stdin,
            timeout=timeout,
            output_cap=output_cap,
            keep_background=keep_background,
        ) as running:
            async for chunk in running:
                (out if chunk.stream == "stdout" else err).extend(chunk.data)
        result = running.result
        return ExecResult(
            exit_code=result.exit_code,
            timed_out=result.timed_out,
            oom_killed=result.oom_killed,
            truncated_bytes=result.truncated_bytes,
            duration=result.duration,
            stdout=bytes(out),
            stderr=bytes(err),
        )

    async def run_quiet(
        self,
        argv: list[str],
        *,
        timeout: float = 10.0,  # noqa: ASYNC109 (see SandboxEngine.call)
    ) -> tuple[int | None, bytes]:
        """A plain exec without the wrapper, for the package's own housekeeping (kill, OOM counter)."""

        def run(c: docker.DockerClient) -> tuple[int | None, bytes]:
            exec_id = c.api.exec_create(self.id, argv, stdout=True, stderr=False, user=self.spec.user)["Id"]
            output = c.api.exec_start(exec_id)
            code = c.api.exec_inspect(exec_id).get("ExitCode")
            return (int(code) if code is not None else None), bytes(output or b"")[:4096]

        return await self.engine_call(run, timeout=timeout, container=True)

    async def oom_happened(self) -> bool:
        """Whether the memory cgroup OOM-killed anything since the last time we looked."""
        try:
            code, out = await self.run_quiet(["/bin/sh", "-c", OOM_COUNTER], timeout=10)
        except Exception:
            code, out = None, b""
        if code == 0 and out.strip().isdigit():
            count = int(out.strip())
            happened = count > self._oom_seen
            self._oom_seen = max(count, self._oom_seen)
            return happened
        # No readable counter (or the container is gone): ask the engine.
        try:
            state = await self.engine_call(lambda c: c.api.inspect_container(self.id)["State"])
        except Exception:
            return False
        return bool(state.get("OOMKilled"))

    async def status(self) -> str:
        """Docker's state: "running", "exited", ... or "removed"."""
        try:
            state = await self.engine_call(lambda c: c.api.inspect_container(self.id)["State"])
        except SandboxGone:
            return "removed"
        return str(state.get("Status", "unknown"))

    async def inspect(self) -> dict[str, Any]:
        return dict(await self.engine_call(lambda c: c.api.inspect_container(self.id)))

    async def stop(self, grace: float = 10.0) -> None:
        """SIGTERM, `grace` seconds, then SIGKILL. Idempotent."""

        def stop(c: docker.DockerClient) -> None:
            with contextlib.suppress(docker.errors.NotFound):
                c.api.stop(self.id, timeout=max(0, int(grace)))

        await self.engine.call(stop, timeout=grace + self.engine.api_timeout)

    def cancel_wall_clock(self) -> None:
        """Drop the host-side timers, wall clock and workspace watch (a pool hands the container on)."""
        if not self._wall_clock.done():
            self._wall_clock.cancel()
        self._workspace_watch.stop()

    async def remove(self) -> None:
        """Kill and delete the container. Idempotent."""
        self._removed = True
        self.cancel_wall_clock()

        await self.engine.call(lambda c: remove_container(c, self.id))

    async def _enforce_wall_clock(self) -> None:
        await asyncio.sleep(max(0.0, self.remaining))
        with contextlib.suppress(Exception):
            await self.stop(grace=0)


__all__ = ["ExecResult", "ExecStream", "OutputChunk", "Sandbox", "SandboxEngine"]
