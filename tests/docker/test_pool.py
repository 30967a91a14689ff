"""The opt-in warm pool against the real engine."""

import time
from pathlib import Path

from sandbox import Limits, SandboxEngine, SandboxPool, list_sandboxes, reap

from .conftest import INSTANCE, SpecFactory


async def test_pool_hands_out_ready_sandboxes(engine: SandboxEngine, make_spec: SpecFactory, tmp_path: Path) -> None:
    template = make_spec(env={"FROM_TEMPLATE": "1"}, limits=Limits(wall_clock_seconds=120))
    async with SandboxPool(engine, template, size=2, root=tmp_path / "pool") as pool:
        assert pool.ready == 2
        t0 = time.monotonic()
        sb = await pool.acquire(task="task-9", run="run-9", env={"PER_TASK": "yes"})
        r = await sb.exec(["sh", "-c", "echo $FROM_TEMPLATE $PER_TASK; pwd; ls -A /workspace | wc -l"])
        first_output = time.monotonic() - t0
        assert r.stdout == b"1 yes\n/workspace\n0\n"
        assert sb.spec.workspace.parent == tmp_path / "pool"
        assert sb.spec.run == "run-9" and sb.spec.task == "task-9"
        assert 119 < sb.remaining <= 120, "the wall clock starts at acquire"
        # Files the host puts in the workspace show up inside.
        (sb.spec.workspace / "hello.txt").write_text("hi")
        assert (await sb.exec(["cat", "hello.txt"])).stdout == b"hi"
        assert first_output < 2

        listed = {s.run: s for s in await list_sandboxes(engine, INSTANCE)}
        assert listed["run-9"].task == "task-9"
        assert listed["run-9"].status == "running"
        # reap keeps the handed-out sandbox when its run is kept, and the pool's idle ones always.
        assert await reap(engine, INSTANCE, keep={"run-9"}) == []
        assert await sb.status() == "running"
        removed = await reap(engine, INSTANCE, keep=set())
        assert [s.run for s in removed] == ["run-9"]
        assert await sb.status() == "removed"

        # The pool refills in the background.
        for _ in range(100):
            if pool.ready == 2:
                break
            await __import__("asyncio").sleep(0.1)
        assert pool.ready == 2
        idle_ids = {s.id for s in await list_sandboxes(engine, INSTANCE) if s.run.startswith("pool:")}
        assert len(idle_ids) == 2
    # Closing the pool removes its idle sandboxes.
    assert not [s for s in await list_sandboxes(engine, INSTANCE) if s.run.startswith("pool:")]


async def test_empty_pool_falls_back_to_a_normal_start(
    engine: SandboxEngine, make_spec: SpecFactory, tmp_path: Path
) -> None:
    pool = SandboxPool(engine, make_spec(), size=1, root=tmp_path / "pool")
    try:
        sb = await pool.acquire(task="t", run="r-fallback")
        async with sb:
            assert (await sb.exec(["true"])).exit_code == 0
            labels = (await sb.inspect())["Config"]["Labels"]
            assert labels["forgehand.run"] == "r-fallback"
    finally:
        await pool.close()
    assert not [s for s in await list_sandboxes(engine, INSTANCE) if s.run.startswith("pool:")]


async def test_closing_during_a_refill_leaves_nothing(
    engine: SandboxEngine, make_spec: SpecFactory, tmp_path: Path
) -> None:
    async with SandboxPool(engine, make_spec(), size=2, root=tmp_path / "pool") as pool:
        sb = await pool.acquire(task="t", run="r-closing")
        await sb.remove()
        # The refill has just started; the pool closes under it.
    assert not [s for s in await list_sandboxes(engine, INSTANCE) if s.run.startswith("pool:")]
