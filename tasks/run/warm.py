"""The run's sandbox spec, and the worker's warm pools of started sandboxes (sandbox/pool.py).

With `FORGEHAND_TASK_SANDBOX_POOL=N` (0 = off) the worker keeps N sandboxes started ahead for the
plain image and for the agents image (when built), and for the images of the last environments its
runs used (`pool_environment`, at most ENVIRONMENT_POOLS), each with a quota workspace of the instance's
size and a channel directory with the gateway relay listening. A run whose spec is what the pool
makes (the instance's limits and hardening: no repository weakening or other limits, the gateway
relay alone, a channel) takes one; any other run, or one that finds the pool empty, starts its own
as before. Either way the sandbox is the same spec and the workspace the run's own path."""

import asyncio
from pathlib import Path

import structlog

from forge.core.settings import Settings
from sandbox import (
    DEFAULT_AGENTS_IMAGE,
    GATEWAY_RELAY_PORT,
    HOSTS_FILE_NAME,
    EngineUnavailable,
    Limits,
    MiB,
    Relay,
    SandboxPool,
    SandboxSpec,
    sweep_pool_dirs,
)
from tasks.run.env import RunEnv
from tasks.run.gateway import SOCKET_NAME

log = structlog.get_logger("forgehand.tasks")

GATEWAY_RELAY = Relay(GATEWAY_RELAY_PORT, SOCKET_NAME)
# A replacement waits this long after a run took a pooled sandbox: started at once, it competed for
# the CPU with the agent's own start (measured: the CLI took 2.5 s instead of 1 s on 2 cores).
REFILL_DELAY_SECONDS = 3.0
# Environments whose images the worker keeps warm sandboxes of, besides the built-in images.
ENVIRONMENT_POOLS = 4
# The worker that started a sandbox (its id, as runs[].worker shows it): on every run's container and
# every pooled one. Not "forgehand.": the sandbox spec keeps that prefix for its own labels.
LABEL_WORKER = "org.forgehand.worker"


def run_limits(settings: Settings) -> Limits:
    return Limits(
        wall_clock_seconds=settings.task_wall_clock_seconds,
        exec_timeout_seconds=settings.task_tool_timeout_seconds,
        workspace_bytes=settings.task_workspace_limit_mb * MiB,
    )


def hosts_file(settings: Settings) -> Path:
    """The /etc/hosts of this worker's run sandboxes (sandbox.SandboxSpec.hosts_file), beside their
    channels: the run channel directory is on the engine's host at the same path already."""
    return settings.effective_run_channel_dir / HOSTS_FILE_NAME


def worker_labels(env: RunEnv) -> dict[str, str]:
    """The labels of the sandboxes this worker starts (for runs and for its pools alike: a pooled
    sandbox matches a run's spec only when they are the same)."""
    return {LABEL_WORKER: env.worker_id} if env.worker_id else {}


def mount_limit(settings: Settings) -> int | None:
    """The size of the run's workspace filesystem (None: a plain directory, the watchdog)."""
    return settings.task_workspace_limit_mb * MiB if settings.task_workspace_quota == "mount" else None


def pools_root(settings: Settings) -> Path:
    return settings.data_dir.resolve() / "pool"


def _same_filesystem(a: Path, b: Path) -> bool:
    for p in (a, b):
        p.mkdir(mode=0o755, parents=True, exist_ok=True)
    return a.stat().st_dev == b.stat().st_dev


async def open_pools(env: RunEnv, workspaces: Path) -> dict[str, SandboxPool]:
    """The worker's pools, filling in the background; none when the setting is 0 or the slots'
    directories could not be moved onto the runs' (another filesystem)."""
    settings = env.settings
    root, channels = pools_root(settings), settings.effective_run_channel_dir
    await asyncio.to_thread(sweep_pool_dirs, root, channels)  # a crashed process's slots
    size = settings.task_sandbox_pool
    if size <= 0:
        return {}
    # (A slot's channel directory is made in the channel root itself: always the same filesystem.)
    if not await asyncio.to_thread(_same_filesystem, root, workspaces):
        log.warning("sandbox pool off: its directory is on another filesystem than the workspaces", root=str(root))
        return {}
    pools: dict[str, SandboxPool] = {}
    for image in dict.fromkeys([env.image, env.agents_image or DEFAULT_AGENTS_IMAGE]):
        try:
            if not await env.engine.image_ready(image):
                continue
        except EngineUnavailable as exc:
            log.warning("sandbox pool off: no Docker engine answered", error=str(exc))
            return pools
        pools[image] = _pool_of(env, image)
    return pools


def _pool_of(env: RunEnv, image: str) -> SandboxPool:
    """A pool of `image`'s sandboxes, filling in the background."""
    settings = env.settings
    root = pools_root(settings)
    template = SandboxSpec(
        image=image, workspace=root, instance=env.instance, task="pool", run="pool",
        limits=run_limits(settings), relays=(GATEWAY_RELAY,), extra_labels=worker_labels(env),
        hosts_file=hosts_file(settings),
    )  # fmt: skip
    pool = SandboxPool(
        env.engine, template, size=settings.task_sandbox_pool, root=root,
        channel_root=settings.effective_run_channel_dir, workspace_limit_bytes=mount_limit(settings),
        refill_delay=REFILL_DELAY_SECONDS,
    )  # fmt: skip
    pool.fill_later()
    pool.keep_fresh()
    return pool


async def pool_environment(env: RunEnv, image: str, *, prefix: str, keep: int = ENVIRONMENT_POOLS) -> None:
    """Warm sandboxes of an environment's image (tag starting with `prefix`) too, when the worker
    keeps pools (the built-in images' pools exist): the environment's next run takes one. At most
    `keep` environments are pooled; the one used longest ago gives its place up."""
    if not env.pools or image in env.pools:
        if image in env.pools:
            env.pools[image] = env.pools.pop(image)  # most recently used last
        return
    pooled = [name for name in env.pools if name.startswith(prefix)]
    for name in pooled[: max(0, len(pooled) - keep + 1)]:
        await env.pools.pop(name).close()
    env.pools[image] = _pool_of(env, image)


async def close_pools(pools: dict[str, SandboxPool]) -> None:
    """Remove the idle sandboxes (handed-out ones belong to their runs)."""
    items = list(pools.values())
    pools.clear()
    await asyncio.gather(*(p.close() for p in items), return_exceptions=True)
