"""Opt-in warm pool: sandboxes started ahead of time from one template, each handed out once.

Starting a container (and making its workspace filesystem) is most of a sandbox's start-up cost. A
pool keeps `size` of them running, each in a slot of its own: an empty workspace (a quota mount of
the template's size when `workspace_limit_bytes` is given) under `root`, and an empty channel
directory under `channel_root`, both bind-mounted at creation, with the template's relays already
listening (a relay connects to its socket per connection, so the socket may come later).

A mount cannot be added to a started container, so `acquire` moves the slot onto the run's own
paths instead: the workspace filesystem is bound at the run's workspace path (a plain directory is
renamed), the run's channel sockets move into the slot's directory, which takes the run's channel
path. The container keeps seeing the same directories (a bind follows the directory, not its path);
the host finds them where recovery and the channel look. Then the caller checks the run's tree out.

A pooled container is never reused: it is handed out once, then removed with its run like any
other. Its hardening is the template's (`container_create_kwargs` of the same spec). Labels cannot
change after creation, so it carries `forgehand.run=pool:<pool id>` and, on acquire, is renamed so
that its name carries the task and run (hex-encoded); `list_sandboxes`/`reap` read them from there.
Idle containers of a pool alive in this process (or in another live process) are never reaped;
after a crash they all go, and `sweep_pool_dirs` removes the slots' directories.
"""

import asyncio
import contextlib
import os
import secrets
import shutil
import time
from collections.abc import Mapping
from pathlib import Path

import docker
import msgspec

from .box import Sandbox
from .engine import SandboxEngine
from .owner import current_owner, process_start
from .quota import quota_mounts
from .slots import adopt_channel, move_workspace
from .spec import LABEL_POOL, SandboxSpec
from .workspace import prepare_workspace, remove_workspace

POOL_RUN_PREFIX = "pool:"
CHANNEL_PREFIX = "pool-"
_NAME_PREFIX = "forgehand-pool-"
_MAX_ASSIGNED_NAME = 240

# The pools alive in this process, by id (their idle containers are kept by `reap`).
LIVE_POOLS: dict[str, "SandboxPool"] = {}


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


def _pool_id() -> str:
    # The owner's pid and start time: `sweep_pool_dirs` tells a dead pool's directories from a live one's.
    me = current_owner()
    return f"{me.pid}.{me.start or 0}.{secrets.token_hex(4)}"


def pool_alive(pool_id: str) -> bool:
    pid, _, rest = pool_id.partition(".")
    start, _, _ = rest.partition(".")
    if not pid.isdigit():
        return False
    if int(pid) == os.getpid():
        return pool_id in LIVE_POOLS
    return process_start(int(pid)) == start


def sweep_pool_dirs(root: Path, channel_root: Path | None = None) -> list[Path]:
    """Remove the slot directories (workspaces with their quota mounts, channels) of pools whose
    process is gone. Blocking."""
    removed: list[Path] = []
    if root.is_dir():
        for pool_dir in root.iterdir():
            if pool_dir.is_symlink() or not pool_dir.is_dir() or pool_alive(pool_dir.name):
                continue
            for mounted in quota_mounts(pool_dir):
                remove_workspace(mounted)
            if not quota_mounts(pool_dir):  # never delete through a mount that is still there
                shutil.rmtree(pool_dir, ignore_errors=True)
                removed.append(pool_dir)
    if channel_root is not None and channel_root.is_dir():
        for entry in channel_root.iterdir():
            if not entry.name.startswith(CHANNEL_PREFIX) or entry.is_symlink() or not entry.is_dir():
                continue
            if not pool_alive(entry.name.removeprefix(CHANNEL_PREFIX).rpartition("-")[0]):
                shutil.rmtree(entry, ignore_errors=True)
                removed.append(entry)
    return removed


class _Idle(msgspec.Struct):
    sandbox: Sandbox
    token: str
    ready_at: float


def _same_container(a: SandboxSpec, b: SandboxSpec) -> bool:
    """Whether a container made from `a` is what `b` asks for (paths and identity aside)."""
    keep = {"workspace": Path("/"), "task": "", "run": "", "env": {}, "channel_dir": None, "pool": ""}
    # The wall clock is the host's (restarted at acquire); the idle process lives longer in the pool.
    limits = msgspec.structs.replace(b.limits, wall_clock_seconds=a.limits.wall_clock_seconds)
    return msgspec.structs.replace(a, **keep) == msgspec.structs.replace(b, limits=limits, **keep)


class SandboxPool:
    """Keeps `size` sandboxes of `template` running and hands each out once (see the module doc)."""

    def __init__(
        self,
        engine: SandboxEngine,
        template: SandboxSpec,
        *,
        size: int,
        root: Path,
        channel_root: Path | None = None,
        workspace_limit_bytes: int | None = None,
        max_idle_seconds: int = 600,
        parallel_starts: int = 2,
        refill_delay: float = 0.0,
    ) -> None:
        if size < 1:
            raise ValueError("a pool needs a size of at least 1")
        if template.relays and channel_root is None:
            raise ValueError("a template with relays needs a channel_root")
        self.engine = engine
        self.template = template
        self.size = size
        self.id = _pool_id()
        self.root = root / self.id
        self.channel_root = channel_root
        self.workspace_limit_bytes = workspace_limit_bytes
        self.max_idle_seconds = max_idle_seconds
        # A replacement started at once competes for the CPU with the run that just took its
        # sandbox (the agent's own start is CPU-bound): the worker waits a little.
        self.refill_delay = refill_delay
        self.handed_out = 0
        self._idle: list[_Idle] = []
        self._starting = 0
        self._start_slots = asyncio.Semaphore(parallel_starts)
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self._closing = asyncio.Event()
        self._settled = asyncio.Condition()  # a start ended (fill waits for the ones in flight)
        LIVE_POOLS[self.id] = self

    async def __aenter__(self) -> "SandboxPool":
        await self.fill()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def ready(self) -> int:
        return len(self._idle)

    def matches(self, spec: SandboxSpec, *, workspace_limit_bytes: int | None) -> bool:
        """Whether a sandbox of this pool is what `spec` asks for (same image, limits, hardening,
        relays, a channel or none, the same workspace filesystem)."""
        return (
            _same_container(self.template, spec)
            and (spec.channel_dir is not None) == (self.channel_root is not None)
            and workspace_limit_bytes == self.workspace_limit_bytes
        )

    async def fill(self) -> None:
        """Start sandboxes until `size` are ready (waits for them, and for those a background
        refill is starting)."""
        missing = self.size - len(self._idle) - self._starting
        await asyncio.gather(*(self._start_one() for _ in range(max(0, missing))))
        async with self._settled:
            await self._settled.wait_for(lambda: not self._starting or self._closed or len(self._idle) >= self.size)

    def fill_later(self, delay: float = 0.0) -> None:
        """`fill` in the background after `delay` seconds (a failed start only means fewer ready)."""
        if self._closed:
            return
        task = asyncio.get_running_loop().create_task(self._fill_after(delay))
        self._tasks.add(task)
        task.add_done_callback(self._fill_done)

    async def _fill_after(self, delay: float) -> None:
        if delay > 0:
            with contextlib.suppress(TimeoutError):  # closing ends the wait (and the fill does nothing)
                async with asyncio.timeout(delay):
                    await self._closing.wait()
        await self.fill()

    def _fill_done(self, task: "asyncio.Task[None]") -> None:
        self._tasks.discard(task)
        # acquire falls back to an ordinary start, which reports the engine's error to its caller.
        if not task.cancelled():
            task.exception()

    def keep_fresh(self) -> None:
        """In the background until closed: replace idle sandboxes before `max_idle_seconds`, so a
        run after a quiet spell still finds a ready one (acquire discards a stale one)."""
        if self._closed:
            return
        task = asyncio.get_running_loop().create_task(self._refresh_loop())
        self._tasks.add(task)
        task.add_done_callback(self._fill_done)

    async def _refresh_loop(self) -> None:
        while not self._closed:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.max_idle_seconds / 4):
                    await self._closing.wait()
            stale = [i for i in self._idle if time.monotonic() - i.ready_at > self.max_idle_seconds / 2]
            for idle in stale:
                self._idle.remove(idle)
            await asyncio.gather(*(self._discard(i.sandbox) for i in stale), return_exceptions=True)
            if not self._closed:
                with contextlib.suppress(Exception):
                    await self.fill()

    async def _start_one(self) -> None:
        self._starting += 1
        try:
            async with self._start_slots:
                if self._closed:
                    return
                token = secrets.token_hex(6)
                workspace = self.root / token
                channel = None
                if self.channel_root is not None:
                    channel = self.channel_root / f"{CHANNEL_PREFIX}{self.id}-{token}"
                spec = msgspec.structs.replace(
                    self.template,
                    workspace=workspace,
                    channel_dir=channel,
                    task="pool",
                    run=f"{POOL_RUN_PREFIX}{self.id}",
                    # The idle process must outlive the wait in the pool plus a full wall clock;
                    # the host's timer, restarted at acquire, enforces the real limit.
                    limits=msgspec.structs.replace(
                        self.template.limits,
                        wall_clock_seconds=self.template.limits.wall_clock_seconds + self.max_idle_seconds,
                    ),
                    pool=self.id,
                )
                try:
                    await asyncio.to_thread(self._make_slot, spec)
                    sandbox = await self.engine.start(spec, name=f"{_NAME_PREFIX}{token}")
                except BaseException:
                    await asyncio.to_thread(self._remove_dirs, spec)
                    raise
                if self._closed:
                    await self._discard(sandbox)
                    return
                self._idle.append(_Idle(sandbox, token, time.monotonic()))
        finally:
            self._starting -= 1
            async with self._settled:
                self._settled.notify_all()

    def _make_slot(self, spec: SandboxSpec) -> None:
        prepare_workspace(spec.workspace, limit_bytes=self.workspace_limit_bytes)
        if spec.channel_dir is not None:
            spec.channel_dir.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
            spec.channel_dir.mkdir(mode=0o755)
            spec.channel_dir.chmod(0o755)

    @staticmethod
    def _remove_dirs(spec: SandboxSpec) -> None:
        remove_workspace(spec.workspace)
        if spec.channel_dir is not None:
            shutil.rmtree(spec.channel_dir, ignore_errors=True)

    async def acquire(self, spec: SandboxSpec, *, workspace_limit_bytes: int | None = None) -> Sandbox | None:
        """A started sandbox for `spec` (its task, run, env, workspace and channel paths), or None
        when none is ready or this pool's do not match: then start one as usual.

        `spec.workspace` must not exist yet (or be an empty directory): the slot's workspace takes
        its place. `spec.channel_dir`, when set, is the run's channel directory with its sockets.
        """
        if self._closed or not self.matches(spec, workspace_limit_bytes=workspace_limit_bytes):
            return None
        while self._idle:
            idle = self._idle.pop(0)
            self.fill_later(self.refill_delay)
            if time.monotonic() - idle.ready_at > self.max_idle_seconds:
                await self._discard(idle.sandbox)
                continue
            name = assigned_name(idle.token, spec.task, spec.run)
            if len(name) > _MAX_ASSIGNED_NAME:
                self._idle.insert(0, idle)
                return None
            sandbox = await self._hand_over(idle, spec, name)
            if sandbox is not None:
                self.handed_out += 1
                return sandbox
        self.fill_later(self.refill_delay)
        return None

    async def _hand_over(self, idle: _Idle, spec: SandboxSpec, name: str) -> Sandbox | None:
        old = idle.sandbox
        old.cancel_wall_clock()  # its watch looks at the slot's path, which is going away
        container_id = old.id

        def rename(c: docker.DockerClient) -> None:
            c.api.rename(container_id, name)

        def move() -> None:
            move_workspace(old.spec.workspace, spec.workspace)
            if spec.channel_dir is not None and old.spec.channel_dir is not None:
                adopt_channel(old.spec.channel_dir, spec.channel_dir)

        # Both before anything runs in it; the rename names the run for `reap` after a crash.
        moved, renamed = await asyncio.gather(asyncio.to_thread(move), old.engine_call(rename), return_exceptions=True)
        if isinstance(moved, BaseException) or isinstance(renamed, BaseException):
            # The run's own paths stay the run's (its cleanup removes them); the container goes.
            with contextlib.suppress(Exception):
                await old.remove()
            await asyncio.to_thread(self._remove_dirs, old.spec)  # the slot's paths only, never the run's
            return None
        handed = msgspec.structs.replace(spec, pool=self.id)
        return Sandbox(self.engine, container_id, name, handed, started_at=time.monotonic())

    async def _discard(self, sandbox: Sandbox) -> None:
        with contextlib.suppress(Exception):
            await sandbox.remove()
        await asyncio.to_thread(self._remove_dirs, sandbox.spec)

    async def close(self) -> None:
        """Remove every idle sandbox and its slot (handed-out ones are their holders' to remove)."""
        self._closed = True
        self._closing.set()
        LIVE_POOLS.pop(self.id, None)
        # Let starts in flight finish (they see `_closed` and discard what they made): cancelling
        # them would leave a container the engine creates anyway.
        await asyncio.gather(*list(self._tasks), return_exceptions=True)
        idle, self._idle = self._idle, []
        await asyncio.gather(*(self._discard(i.sandbox) for i in idle))
        if not await asyncio.to_thread(quota_mounts, self.root):
            await asyncio.to_thread(shutil.rmtree, self.root, True)


def pool_identity(labels: Mapping[str, str], name: str) -> tuple[str, str] | None:
    """(task, run) a pooled container stands for, from its labels and name; None if not pooled."""
    if LABEL_POOL not in labels:
        return None
    assigned = parse_assigned_name(name)
    if assigned is not None:
        return assigned
    return labels.get("forgehand.task", "pool"), f"{POOL_RUN_PREFIX}{labels[LABEL_POOL]}"


def idle_pool_kept(run: str, host: str, orphaned: bool) -> bool:
    """Whether `reap` keeps an idle pooled container (run `pool:<id>`): while its pool lives, in
    this process or another one on this host; another host's only its creator's death ends."""
    if not run.startswith(POOL_RUN_PREFIX) or orphaned:
        return False
    if host and host != current_owner().host:
        return True
    return pool_alive(run.removeprefix(POOL_RUN_PREFIX))


__all__ = ["LABEL_POOL", "SandboxPool", "pool_alive", "sweep_pool_dirs"]
