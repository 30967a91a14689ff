"""Opt-in warm pool: sandboxes started ahead of time from one template, each handed out once.

Starting a container is most of a sandbox's start-up cost. A pool keeps `size` of them running,
each with its own empty workspace directory under `root`; `acquire` hands one over (the caller then
fills `sandbox.spec.workspace`) and starts a replacement in the background. A pooled container is
never reused: `remove` deletes it as usual.

Labels cannot change after creation, so a pooled container carries `forgehand.run=pool:<pool id>`;
on acquire it is renamed so that its name carries the task and run (hex-encoded), and
`list_sandboxes`/`reap` read them from there. Idle containers of a pool that is alive in this
process are never reaped; after a crash nothing is alive and they all go.
"""

import asyncio
import contextlib
import secrets
import shutil
import time
from collections.abc import Mapping
from pathlib import Path

import docker
import msgspec

from .box import Sandbox
from .engine import SandboxEngine
from .spec import LABEL_POOL, SandboxSpec
from .workspace import prepare_workspace

POOL_RUN_PREFIX = "pool:"
_NAME_PREFIX = "forgehand-pool-"
_MAX_ASSIGNED_NAME = 240

# Pool ids alive in this process (their idle containers are kept by `reap`).
LIVE_POOLS: set[str] = set()


def assigned_name(token: str, task: str, run: str) -> str:
    return f"{_NAME_PREFIX}{token}-t-{task.encode().hex()}-r-{run.encode().hex()}"


def parse_assigned_name(name: str) -> tuple[str, str] | None:
    """(task, run) from the name of an acquired pooled container, None for anything else."""
    if not name.startswith(_NAME_PREFIX):
        return None
    _, sep, rest = name[len(_NAME_PREFIX) :].partition("-t-")
    task_hex, sep2, run_hex = rest.partition("-r-")
    if not sep or not sep2:
        return None
    try:
        return bytes.fromhex(task_hex).decode(), bytes.fromhex(run_hex).decode()
    except ValueError:
        return None


class _Idle(msgspec.Struct):
    sandbox: Sandbox
    token: str
    ready_at: float


class SandboxPool:
    """Keeps `size` sandboxes of `template` running and hands them out (see the module doc)."""

    def __init__(
        self,
        engine: SandboxEngine,
        template: SandboxSpec,
        *,
        size: int,
        root: Path,
        max_idle_seconds: int = 600,
        parallel_starts: int = 4,
    ) -> None:
        if size < 1:
            raise ValueError("a pool needs a size of at least 1")
        self.engine = engine
        self.template = template
        self.size = size
        self.root = root
        self.max_idle_seconds = max_idle_seconds
        self.id = secrets.token_hex(4)
        self._idle: list[_Idle] = []
        self._starting = 0
        self._start_slots = asyncio.Semaphore(parallel_starts)
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        LIVE_POOLS.add(self.id)

    async def __aenter__(self) -> "SandboxPool":
        await self.fill()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def ready(self) -> int:
        return len(self._idle)

    async def fill(self) -> None:
        """Start sandboxes until `size` are ready (waits for them)."""
        missing = self.size - len(self._idle) - self._starting
        await asyncio.gather(*(self._start_one() for _ in range(max(0, missing))))

    async def _start_one(self) -> None:
        self._starting += 1
        try:
            async with self._start_slots:
                if self._closed:
                    return
                token = secrets.token_hex(6)
                workspace = await asyncio.to_thread(prepare_workspace, self.root / token)
                limits = msgspec.structs.replace(
                    self.template.limits,
                    # The idle process must outlive the wait in the pool plus a full wall clock;
                    # the host's timer, restarted at acquire, enforces the real limit.
                    wall_clock_seconds=self.template.limits.wall_clock_seconds + self.max_idle_seconds,
                )
                spec = msgspec.structs.replace(
                    self.template,
                    workspace=workspace,
                    task="pool",
                    run=f"{POOL_RUN_PREFIX}{self.id}",
                    limits=limits,
                    pool=self.id,
                )
                sandbox = await self.engine.start(spec, name=f"{_NAME_PREFIX}{token}")
                if self._closed:
                    await self._discard(sandbox)
                    return
                self._idle.append(_Idle(sandbox, token, time.monotonic()))
        finally:
            self._starting -= 1

    def _refill_later(self) -> None:
        if self._closed:
            return
        task = asyncio.get_running_loop().create_task(self.fill())
        self._tasks.add(task)
        task.add_done_callback(self._refill_done)

    def _refill_done(self, task: "asyncio.Task[None]") -> None:
        self._tasks.discard(task)
        # A failed refill only means fewer ready sandboxes: acquire falls back to a normal start,
        # which reports the engine's error to its caller.
        if not task.cancelled():
            task.exception()

    async def acquire(self, *, task: str, run: str, env: Mapping[str, str] | None = None) -> Sandbox:
        """A running sandbox for this task and run, from the pool if one is ready."""
        spec_env = {**self.template.env, **(env or {})}
        while self._idle:
            idle = self._idle.pop(0)
            if time.monotonic() - idle.ready_at > self.max_idle_seconds:
                await self._discard(idle.sandbox)
                continue
            name = assigned_name(idle.token, task, run)
            if len(name) > _MAX_ASSIGNED_NAME:
                self._idle.insert(0, idle)
                break
            container_id = idle.sandbox.id

            def rename(c: docker.DockerClient, cid: str = container_id, new: str = name) -> None:
                c.api.rename(cid, new)

            try:
                await idle.sandbox.engine_call(rename)
            except Exception:
                await self._discard(idle.sandbox)
                continue
            idle.sandbox.cancel_wall_clock()
            spec = msgspec.structs.replace(
                self.template,
                workspace=idle.sandbox.spec.workspace,
                task=task,
                run=run,
                env=spec_env,
                pool=self.id,
            )
            self._refill_later()
            return Sandbox(self.engine, idle.sandbox.id, name, spec, started_at=time.monotonic())
        # Nothing ready: an ordinary start, in the caller's workspace under the pool root.
        self._refill_later()
        workspace = await asyncio.to_thread(prepare_workspace, self.root / secrets.token_hex(6))
        spec = msgspec.structs.replace(self.template, workspace=workspace, task=task, run=run, env=spec_env)
        return await self.engine.start(spec)

    async def _discard(self, sandbox: Sandbox) -> None:
        with contextlib.suppress(Exception):
            await sandbox.remove()
        await asyncio.to_thread(shutil.rmtree, sandbox.spec.workspace, True)

    async def close(self) -> None:
        """Remove every idle sandbox (handed-out ones are their holders' to remove)."""
        self._closed = True
        LIVE_POOLS.discard(self.id)
        # Let starts in flight finish (they see `_closed` and discard what they made): cancelling
        # them would leave a container the engine creates anyway.
        await asyncio.gather(*list(self._tasks), return_exceptions=True)
        idle, self._idle = self._idle, []
        await asyncio.gather(*(self._discard(i.sandbox) for i in idle))


def pool_identity(labels: Mapping[str, str], name: str) -> tuple[str, str] | None:
    """(task, run) a pooled container stands for, from its labels and name; None if not pooled."""
    if LABEL_POOL not in labels:
        return None
    assigned = parse_assigned_name(name)
    if assigned is not None:
        return assigned
    return labels.get("forgehand.task", "pool"), f"{POOL_RUN_PREFIX}{labels[LABEL_POOL]}"


__all__ = ["LABEL_POOL", "SandboxPool"]
