"""What the modules around a started container need of each other, as Protocols.

A started sandbox (`box.Sandbox`) runs its commands through commands.py, its interactive processes
through process.py and its relays through relays.py; each of those needs a few things of the
sandbox, and the sandbox needs a few things of the engine that started it. Typed against these
Protocols instead of the concrete classes, the imports go one way only: engine > box > process >
commands (relays beside them), and this module imports nothing of theirs.
"""

from collections.abc import Callable
from typing import Protocol, TypeVar

import docker

from .spec import SandboxSpec

T = TypeVar("T")


class EngineCalls(Protocol):
    """What a started sandbox and the image lookups need of the engine (`engine.SandboxEngine`)."""

    @property
    def api_timeout(self) -> float: ...

    async def call(
        self,
        fn: Callable[[docker.DockerClient], T],
        *,
        timeout: float | None = None,  # noqa: ASYNC109 (bounds a thread, which no cancel scope can)
    ) -> T:
        """Run `fn(client)` in the engine's thread pool, bounded by `timeout` (default api_timeout)."""
        ...


class TrackedProcess(Protocol):
    """What a sandbox needs of the processes it remembers (`process.SandboxProcess`)."""

    def sandbox_removed(self) -> None:
        """The sandbox is gone: stop reading a stream that no process writes to any more."""
        ...


class StartedSandbox(Protocol):
    """What commands, interactive processes and relays need of a started sandbox (`box.Sandbox`)."""

    @property
    def id(self) -> str: ...

    @property
    def spec(self) -> SandboxSpec: ...

    @property
    def remaining(self) -> float:
        """Seconds left to the sandbox's wall clock."""
        ...

    async def engine_call(
        self,
        fn: Callable[[docker.DockerClient], T],
        *,
        timeout: float | None = None,  # noqa: ASYNC109 (see EngineCalls.call)
        container: bool = False,
    ) -> T:
        """`EngineCalls.call`, with "no such container" / "not running" turned into SandboxGone."""
        ...

    async def run_quiet(
        self,
        argv: list[str],
        *,
        timeout: float = 10.0,  # noqa: ASYNC109 (see EngineCalls.call)
    ) -> tuple[int | None, bytes]:
        """A plain exec without the wrapper: its exit code and the start of its stdout."""
        ...

    async def oom_happened(self) -> bool:
        """Whether the memory cgroup OOM-killed anything since the last time anyone looked."""
        ...

    def track(self, process: TrackedProcess) -> None:
        """Remember a started process, so that removing the sandbox ends its readers."""
        ...
