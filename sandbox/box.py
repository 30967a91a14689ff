"""A started sandbox: commands (`exec`, `stream`, `spawn`), limits, stop and removal."""

import asyncio
import contextlib
import os
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import docker
import docker.errors

from .commands import OOM_COUNTER, ExecResult, ExecStream, close_exec_socket, validate_argv, validate_exec_env
from .creation import remove_container
from .errors import SandboxError, SandboxGone, SpecRefused
from .process import DEFAULT_LINE_CAP, DEFAULT_STDERR_CAP, SandboxProcess
from .protocols import EngineCalls, TrackedProcess
from .pump import read_stdout
from .quota import QuotaKind, WorkspaceWatch
from .spec import WORKSPACE_DIR, SandboxSpec

T = TypeVar("T")

QUIET_OUTPUT_CAP = 4096  # what `run_quiet` keeps of a command's stdout

# The major:minor of the filesystem mounted at /workspace, with shell builtins only (a custom image
# need not have coreutils).
_WORKSPACE_DEVICE = (
    f'while read -r _ _ dev _ mnt _; do [ "$mnt" = {WORKSPACE_DIR} ] && echo "$dev"; done </proc/self/mountinfo'
)


class Sandbox:
    """A started sandbox. Use as `async with await engine.start(spec) as sb:` to remove it afterwards."""

    def __init__(
        self,
        engine: EngineCalls,
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
        self._processes: weakref.WeakSet[TrackedProcess] = weakref.WeakSet()
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
        limit, cap = self._check_command(cwd, timeout, output_cap)
        return ExecStream(
            self,
            validate_argv(argv),
            # The spec's env is in the container already, except for a pooled sandbox, made before
            # its task was known: passing it again with each command covers both.
            env=validate_exec_env({**self.spec.env, **(env or {})}),
            cwd=cwd,
            stdin=stdin,
            timeout=limit,
            output_cap=cap,
            queue_chunks=max(1, queue_chunks),
            keep_background=keep_background,
        )

    def _check_command(self, cwd: str, timeout: float | None, output_cap: int | None) -> tuple[float, int]:
        """The command's timeout (never past the wall clock) and output cap, or why not."""
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
        return min(limit, remaining), cap

    def spawn(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str = WORKSPACE_DIR,
        timeout: float | None = None,
        line_cap: int = DEFAULT_LINE_CAP,
        stderr_cap: int = DEFAULT_STDERR_CAP,
        queue_batches: int = 16,
    ) -> SandboxProcess:
        """An interactive process (stdin open, stdout as capped lines; see process.py).

        `p = await sb.spawn(argv)` or `async with sb.spawn(argv) as p:` starts it; it is killed at
        `timeout` (default the spec's exec timeout, never past the wall clock), by `kill()` and when
        the sandbox is removed. What it leaves running in the background is killed when it exits.
        """
        limit, _ = self._check_command(cwd, timeout, 0)
        if line_cap < 1 or stderr_cap < 0:
            raise SpecRefused("line_cap must be positive and stderr_cap not negative")
        return SandboxProcess(
            self,
            validate_argv(argv),
            env=validate_exec_env({**self.spec.env, **(env or {})}),
            cwd=cwd,
            timeout=limit,
            line_cap=line_cap,
            stderr_cap=stderr_cap,
            queue_batches=queue_batches,
        )

    def track(self, process: TrackedProcess) -> None:
        """Remember a started process, so that removing the sandbox ends its readers."""
        self._processes.add(process)

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
            # Not `exec_start(exec_id)`, which can return nothing for a command that printed: see read_stdout.
            sock = c.api.exec_start(exec_id, socket=True)
            try:
                output = read_stdout(sock, QUIET_OUTPUT_CAP)
            finally:
                close_exec_socket(sock)
            code = c.api.exec_inspect(exec_id).get("ExitCode")
            return (int(code) if code is not None else None), output

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

        try:
            await self.engine.call(lambda c: remove_container(c, self.id))
        finally:
            # Their processes died with the container; make sure nobody waits on their streams.
            for process in list(self._processes):
                process.sandbox_removed()

    async def _enforce_wall_clock(self) -> None:
        await asyncio.sleep(max(0.0, self.remaining))
        with contextlib.suppress(Exception):
            await self.stop(grace=0)
