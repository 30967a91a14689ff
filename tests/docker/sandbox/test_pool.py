"""The warm pool against the real engine: a pooled sandbox is what a fresh one would be, on the
run's own workspace and channel, handed out once, kept by `reap` while idle, gone with its pool."""

import asyncio
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import docker
import httpx
import msgspec
import pytest

from forge.core.settings import Settings
from sandbox import (
    GATEWAY_RELAY_PORT,
    Limits,
    MiB,
    Relay,
    SandboxEngine,
    SandboxPool,
    list_sandboxes,
    prepare_workspace,
    reap,
    remove_workspace,
    sweep_pool_dirs,
)
from sandbox.pool import LIVE_POOLS
from sandbox.quota import image_path, is_mounted, quota_mounts
from tests.docker.conftest import INSTANCE, SpecFactory
from tests.support.agent_box import on_served
from tests.support.anthropic import ScriptedAnthropic, text, tool_use
from tests.support.tasks import all_events, task_settings, tree_files, wait_state
from tests.support.waiting import until

TASKS = "/api/v1/repos/ana/demo/tasks"

QUOTA = 32 * MiB
_ASK_GATEWAY = (
    f"import socket; s = socket.create_connection(('127.0.0.1', {GATEWAY_RELAY_PORT}), 5); s.sendall(b'ping'); "
    "print(s.recv(100).decode())"
)


@pytest.fixture
def pool_dirs(tmp_path: Path, channel_dir: Path) -> tuple[Path, Path]:
    return tmp_path / "pool", channel_dir / "root"


@pytest.fixture
async def pool(
    engine: SandboxEngine, make_spec: SpecFactory, pool_dirs: tuple[Path, Path]
) -> AsyncIterator[SandboxPool]:
    root, channels = pool_dirs
    template = make_spec(limits=Limits(wall_clock_seconds=120), relays=(Relay(GATEWAY_RELAY_PORT, "gateway.sock"),))
    async with SandboxPool(
        engine, template, size=2, root=root, channel_root=channels, workspace_limit_bytes=QUOTA
    ) as made:
        yield made


async def _serve_gateway(channel: Path) -> asyncio.Server:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"pong from " + (await reader.read(4)))
        await writer.drain()
        writer.close()

    channel.mkdir(mode=0o755)
    server = await asyncio.start_unix_server(answer, path=str(channel / "gateway.sock"))
    (channel / "gateway.sock").chmod(0o666)  # the sandbox user connects
    return server


def _hardening(inspect: dict[str, Any]) -> dict[str, Any]:
    host = inspect["HostConfig"]
    fields = ("ReadonlyRootfs", "CapDrop", "CapAdd", "SecurityOpt", "NetworkMode", "Memory", "MemorySwap")
    return {
        **{k: host.get(k) for k in fields},
        "PidsLimit": host.get("PidsLimit"),
        "NanoCpus": host.get("NanoCpus"),
        "Tmpfs": host.get("Tmpfs"),
        "User": inspect["Config"]["User"],
        "Image": inspect["Config"]["Image"],
        "Mounts": sorted((m["Destination"], m["RW"]) for m in inspect["Mounts"]),
    }


async def test_a_pooled_sandbox_is_the_runs_own(
    engine: SandboxEngine, make_spec: SpecFactory, pool: SandboxPool, tmp_path: Path, channel_dir: Path
) -> None:
    assert pool.ready == 2
    run_ws = tmp_path / "workspaces" / "task-9" / "run-9"
    run_channel = channel_dir / "root" / "run-9-channel"
    server = await _serve_gateway(run_channel)
    spec = make_spec(
        workspace=run_ws,
        task="task-9",
        run="run-9",
        env={"PER_TASK": "yes"},
        limits=Limits(wall_clock_seconds=120),
        channel_dir=run_channel,
        relays=(Relay(GATEWAY_RELAY_PORT, "gateway.sock"),),
    )
    try:
        t0 = time.monotonic()
        sb = await pool.acquire(spec, workspace_limit_bytes=QUOTA)
        took = time.monotonic() - t0
        assert sb is not None
        async with sb:
            # The run's paths hold the slot's: its quota filesystem at the run's workspace path, its
            # image beside it, and the run's socket reached through the relay started ahead.
            assert is_mounted(run_ws) and image_path(run_ws).is_file()
            (run_ws / "hello.txt").write_text("hi")
            r = await sb.exec(["sh", "-c", "echo $PER_TASK; cat hello.txt; echo; df -k /workspace | tail -1"])
            out = r.stdout.decode().splitlines()
            assert out[:2] == ["yes", "hi"], r
            assert 16_000 < int(out[2].split()[1]) <= QUOTA // 1024
            assert (await sb.exec(["python3", "-c", _ASK_GATEWAY])).stdout == b"pong from ping\n"
            assert sb.workspace_quota == "mount"
            # The wall clock starts at acquire (between t0 and t0 + took), not when the slot was made.
            before = time.monotonic()
            remaining = sb.remaining
            after = time.monotonic()
            assert 120 - (after - t0) <= remaining <= 120 - (before - t0 - took), (remaining, took)
            assert took < 1.0, took
            listed = {s.run: s for s in await list_sandboxes(engine, INSTANCE)}
            assert listed["run-9"].task == "task-9" and listed["run-9"].status == "running"
            # As hardened as a fresh sandbox of the same spec.
            fresh_ws = prepare_workspace(tmp_path / "fresh", limit_bytes=QUOTA)
            fresh = await engine.start(msgspec_replace(spec, workspace=fresh_ws, run="fresh"))
            async with fresh:
                assert _hardening(await sb.inspect()) == _hardening(await fresh.inspect())
            remove_workspace(fresh_ws)
        # The slot's own paths are gone: nothing is left to hand out twice.
        assert not [p for p in (tmp_path / "pool").glob("*/*") if not p.name.endswith(".img")] or pool.ready
        remove_workspace(run_ws)
    finally:
        server.close()


def msgspec_replace(spec: Any, **changes: Any) -> Any:
    return msgspec.structs.replace(spec, **changes)


async def test_each_pooled_sandbox_is_handed_out_once(
    make_spec: SpecFactory, pool: SandboxPool, tmp_path: Path, channel_dir: Path
) -> None:
    seen: set[str] = set()
    for i in range(4):
        channel = channel_dir / "root" / f"once-{i}"
        server = await _serve_gateway(channel)
        ws = tmp_path / "ws" / f"once-{i}"
        spec = make_spec(
            workspace=ws, run=f"once-{i}", limits=Limits(wall_clock_seconds=120), channel_dir=channel,
            relays=(Relay(GATEWAY_RELAY_PORT, "gateway.sock"),),
        )  # fmt: skip
        await until(lambda: pool.ready, timeout=30, what="the pool's refill (in the background)")
        sb = await pool.acquire(spec, workspace_limit_bytes=QUOTA)
        assert sb is not None
        assert sb.id not in seen
        seen.add(sb.id)
        await sb.remove()
        server.close()
        remove_workspace(ws)
    assert pool.handed_out == 4


async def test_a_spec_the_pool_does_not_match_gets_none(
    make_spec: SpecFactory, pool: SandboxPool, tmp_path: Path, channel_dir: Path
) -> None:
    base = make_spec(
        workspace=tmp_path / "ws", limits=Limits(wall_clock_seconds=120), channel_dir=channel_dir,
        relays=(Relay(GATEWAY_RELAY_PORT, "gateway.sock"),),
    )  # fmt: skip
    other_limits = msgspec_replace(base, limits=Limits(wall_clock_seconds=120, memory_bytes=512 * MiB))
    assert await pool.acquire(other_limits, workspace_limit_bytes=QUOTA) is None
    assert await pool.acquire(base, workspace_limit_bytes=64 * MiB) is None  # another quota size
    assert await pool.acquire(msgspec_replace(base, channel_dir=None, relays=()), workspace_limit_bytes=QUOTA) is None
    # A longer wall clock is the host's to enforce: that one matches.
    assert pool.matches(msgspec_replace(base, limits=Limits(wall_clock_seconds=600)), workspace_limit_bytes=QUOTA)
    assert pool.ready == 2


async def test_reap_keeps_idle_pooled_sandboxes_and_close_removes_them(
    engine: SandboxEngine, make_spec: SpecFactory, pool_dirs: tuple[Path, Path]
) -> None:
    root = pool_dirs[0]
    async with SandboxPool(engine, make_spec(), size=2, root=root, workspace_limit_bytes=QUOTA) as pool:
        assert await reap(engine, INSTANCE, keep=set()) == []
        idle = [s for s in await list_sandboxes(engine, INSTANCE) if s.run.startswith("pool:")]
        assert len(idle) == 2
        assert len(quota_mounts(root)) == 2
    assert not [s for s in await list_sandboxes(engine, INSTANCE) if s.run.startswith("pool:")]
    assert quota_mounts(root) == []
    assert not pool.root.exists()


async def test_closing_during_a_refill_leaves_nothing(
    engine: SandboxEngine, make_spec: SpecFactory, pool_dirs: tuple[Path, Path], tmp_path: Path
) -> None:
    root, channels = pool_dirs
    template = make_spec(relays=(Relay(GATEWAY_RELAY_PORT, "gateway.sock"),))
    async with SandboxPool(engine, template, size=2, root=root, channel_root=channels) as pool:
        channel = channels / "closing"
        server = await _serve_gateway(channel)
        sb = await pool.acquire(
            make_spec(workspace=tmp_path / "ws-closing", channel_dir=channel, relays=template.relays)
        )
        assert sb is not None
        await sb.remove()
        server.close()
        # The refill has just started; the pool closes under it.
    assert not [s for s in await list_sandboxes(engine, INSTANCE) if s.run.startswith("pool:")]
    assert sorted(p.name for p in channels.iterdir()) == ["closing"]  # the run's own, nothing of the pool
    assert not pool.root.exists()


async def test_a_dead_pools_directories_are_swept(tmp_path: Path, channel_dir: Path) -> None:
    """After a crash: the slots of a pool whose process is gone (a pid that does not run) go; a live
    pool's stay."""
    root, channels = tmp_path / "pool", channel_dir
    dead = f"{2**22 + 7}.1.deadbeef"
    ws = prepare_workspace(root / dead / "slot", limit_bytes=QUOTA)
    (channels / f"pool-{dead}-slot").mkdir()
    live = f"{os.getpid()}.0.cafe"  # this process, but not a pool alive here: gone too
    (root / live / "slot").mkdir(parents=True)
    removed = sweep_pool_dirs(root, channels)
    assert sorted(p.name for p in removed) == sorted([dead, live, f"pool-{dead}-slot"])
    assert not is_mounted(ws) and list(root.iterdir()) == [] and list(channels.iterdir()) == []


async def test_claude_code_tasks_take_pooled_sandboxes_once_and_leave_nothing(
    settings: Settings, agents_image: str, docker_client: docker.DockerClient
) -> None:
    """A served worker with FORGEHAND_TASK_SANDBOX_POOL=1: each task's sandbox comes from the pool
    (a different container each time), its work lands on the branch from its own workspace, and
    when the server stops, nothing of the pool is left (containers, slot directories)."""
    s = msgspec.structs.replace(
        task_settings(settings), task_sandbox_pool=1, anthropic_api_key="sk-ant-pool-key", anthropic_model="claude-t"
    )
    turns = [
        tool_use("Write", {"file_path": "/workspace/pooled.txt", "content": "from a pooled sandbox\n"}, id="toolu_w"),
        text("done"),
    ]
    with ScriptedAnthropic(turns * 2) as api:
        s = msgspec.structs.replace(s, anthropic_base_url=api.url)

        async def drive(c: httpx.AsyncClient) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
            out = []
            for number in (1, 2):
                await _pool_ready(agents_image)
                r = await c.post(TASKS, json={"goal": f"write {number}", "agent": "fixer", "runtime": "claude-code"})
                assert r.status_code == 201, r.text
                out.append(
                    (await wait_state(c, number, "awaiting_review", "failed", timeout=180), await all_events(c, number))
                )
            return out

        results, path = await on_served(s, drive)
    containers = []
    for done, events in results:
        assert done["state"] == "awaiting_review", [e["payload"] for e in events if e["kind"] == "notice"]
        assert tree_files(path, done["head_sha"])["pooled.txt"][1] == b"from a pooled sandbox\n"
        sandbox = next(e["payload"] for e in events if e["kind"] == "system" and e["payload"]["phase"] == "sandbox")
        assert sandbox["detail"]["pooled"] is True, sandbox
        containers.append(sandbox["detail"]["container"])
        workspace = next(e["payload"] for e in events if e["kind"] == "system" and e["payload"]["phase"] == "workspace")
        assert workspace["detail"]["quota"] == "mount"
    assert containers[0] != containers[1]
    left = docker_client.containers.list(all=True, filters={"label": f"forgehand.instance={s.instance_id}"})
    assert left == []
    assert list((s.data_dir / "pool").iterdir()) == []
    assert not list(s.effective_run_channel_dir.glob("pool-*"))


async def _pool_ready(image: str) -> None:
    """Wait until the served worker's pool of `image` (in this process) has an idle sandbox again."""
    await until(
        lambda: any(p.ready and p.template.image == image for p in list(LIVE_POOLS.values())),
        timeout=30,
        what="an idle sandbox in the pool",
    )


async def test_idle_sandboxes_are_replaced_before_they_go_stale(
    engine: SandboxEngine, make_spec: SpecFactory, pool_dirs: tuple[Path, Path]
) -> None:
    """A run after a quiet spell still finds a ready sandbox: the pool replaces its idle ones at
    half their `max_idle_seconds` instead of discarding them at acquire."""
    async with SandboxPool(engine, make_spec(), size=1, root=pool_dirs[0], max_idle_seconds=4) as pool:
        first = {s.id for s in await list_sandboxes(engine, INSTANCE) if s.run.startswith("pool:")}
        pool.keep_fresh()
        now: set[str] = set()

        async def replaced() -> bool:
            nonlocal now
            now = {s.id for s in await list_sandboxes(engine, INSTANCE) if s.run.startswith("pool:")}
            return bool(pool.ready and now and not now & first)

        await until(replaced, timeout=30, what="the idle sandbox to be replaced", show=lambda: (first, now))
        assert pool.ready == 1 and len(now) == 1 and not now & first, (first, now)
    assert not [s for s in await list_sandboxes(engine, INSTANCE) if s.run.startswith("pool:")]
