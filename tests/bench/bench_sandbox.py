"""Sandbox speed, printed from one run (`make bench`), against the real engine.

The issue's figures:
    docker run --rm <image> true         the baseline (the CLI, as an operator would type it)
    create+start to first exec output    forgehand's own start (goal: <= 1.3x the baseline)
    one exec of `true`                   (goal: <= 60 ms)
    20 sandboxes started concurrently    p50/p95 (goal: p95 <= 3x the single start)
and, for context, the engine's own floor (a bare SDK exec, 20 concurrent `docker run`s) and the
opt-in warm pool (SandboxPool): acquire to first exec output, alone and 20 at once.
"""

import asyncio
import secrets
import statistics
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import docker
import pytest

from sandbox import (
    DEFAULT_IMAGE,
    Limits,
    Sandbox,
    SandboxEngine,
    SandboxPool,
    SandboxSpec,
    build_image,
    prepare_workspace,
    reap,
)

INSTANCE = f"bench-{secrets.token_hex(3)}"
ROUNDS = 7


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1))))]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:7.1f} ms"


def spec(workspace: Path, run: str) -> SandboxSpec:
    return SandboxSpec(
        image=DEFAULT_IMAGE,
        workspace=workspace,
        instance=INSTANCE,
        task="bench",
        run=run,
        limits=Limits(wall_clock_seconds=600),
    )


async def timed(start: Callable[[], Awaitable[Sandbox]]) -> tuple[float, Sandbox]:
    """From asking for a sandbox to the first byte of a command's output in it."""
    t0 = time.perf_counter()
    sb = await start()
    elapsed: float | None = None
    async with sb.stream(["echo", "ready"]) as s:
        async for _chunk in s:
            if elapsed is None:
                elapsed = time.perf_counter() - t0
    assert elapsed is not None
    return elapsed, sb


def docker_run_cli() -> float:
    t0 = time.perf_counter()
    subprocess.run(["docker", "run", "--rm", DEFAULT_IMAGE, "true"], check=True, capture_output=True)
    return time.perf_counter() - t0


def docker_run_cli_concurrently(n: int) -> list[float]:
    t0 = time.perf_counter()
    procs = [
        subprocess.Popen(["docker", "run", "--rm", DEFAULT_IMAGE, "true"], stdout=subprocess.DEVNULL) for _ in range(n)
    ]
    done = []
    for p in procs:
        p.wait()
        done.append(time.perf_counter() - t0)
    return done


def bare_sdk_exec(container_id: str, rounds: int) -> list[float]:
    """The engine's floor: exec_create + exec_start + read to EOF + exec_inspect, nothing else."""
    client = docker.from_env()
    out = []
    try:
        for _ in range(rounds):
            t0 = time.perf_counter()
            exec_id = client.api.exec_create(container_id, ["true"])["Id"]
            sock = client.api.exec_start(exec_id, socket=True)
            while sock._sock.recv(65536):
                pass
            sock.close()
            client.api.exec_inspect(exec_id)
            out.append(time.perf_counter() - t0)
    finally:
        client.close()
    return out


@pytest.fixture(scope="module")
def image() -> str:
    build_image(DEFAULT_IMAGE)
    return DEFAULT_IMAGE


async def test_bench_sandbox(image: str, tmp_path: Path) -> None:
    docker_run_cli()  # warm the image and the engine's caches
    baseline = statistics.median(docker_run_cli() for _ in range(ROUNDS))
    cli_many = docker_run_cli_concurrently(20)

    async with SandboxEngine() as engine:
        try:
            singles = []
            for i in range(ROUNDS):
                ws = prepare_workspace(tmp_path / f"single-{i}")
                elapsed, sb = await timed(lambda ws=ws, i=i: engine.start(spec(ws, f"single-{i}")))  # type: ignore[misc]
                singles.append(elapsed)
                await sb.remove()
            single = statistics.median(singles)

            sb = await engine.start(spec(prepare_workspace(tmp_path / "exec"), "exec"))
            for _ in range(5):
                await sb.exec(["true"])
            execs = []
            for _ in range(30):
                t0 = time.perf_counter()
                r = await sb.exec(["true"])
                execs.append(time.perf_counter() - t0)
                assert r.exit_code == 0
            bare = await asyncio.to_thread(bare_sdk_exec, sb.id, 30)
            await sb.remove()

            workspaces = [prepare_workspace(tmp_path / f"many-{i}") for i in range(20)]
            results = await asyncio.gather(
                *(timed(lambda ws=ws, i=i: engine.start(spec(ws, f"many-{i}"))) for i, ws in enumerate(workspaces))  # type: ignore[misc]
            )
            many = [elapsed for elapsed, _ in results]
            await asyncio.gather(*(sb.remove() for _, sb in results))

            # The opt-in warm pool: filled ahead of time (not timed), then handed out.
            template = spec(tmp_path / "unused", "template")
            t0 = time.perf_counter()
            async with SandboxPool(engine, template, size=20, root=tmp_path / "pool") as pool:
                fill_seconds = time.perf_counter() - t0

                async def take(run: str, pool: SandboxPool = pool) -> Sandbox:
                    # The run's own workspace path: the slot's directory moves there.
                    sb = await pool.acquire(spec(tmp_path / "runs" / run, run))
                    assert sb is not None, "the pool had nothing ready"
                    return sb

                pooled_singles = []
                for i in range(ROUNDS):
                    elapsed, sb = await timed(lambda i=i: take(f"pooled-{i}"))  # type: ignore[misc]
                    pooled_singles.append(elapsed)
                    await sb.remove()
                    await pool.fill()  # wait for the refill, so the next one is measured alone
                pooled_single = statistics.median(pooled_singles)
                pooled = await asyncio.gather(
                    *(timed(lambda i=i: take(f"pooled-many-{i}")) for i in range(20))  # type: ignore[misc]
                )
                pooled_many = [elapsed for elapsed, _ in pooled]
                await asyncio.gather(*(sb.remove() for _, sb in pooled))
        finally:
            await reap(engine, INSTANCE, keep=set())

    p50, p95 = pct(many, 50), pct(many, 95)
    pp50, pp95 = pct(pooled_many, 50), pct(pooled_many, 95)
    lines = [
        "",
        f"sandbox benchmark ({image}; medians unless noted)",
        f"  docker run --rm <image> true           {ms(baseline)}   baseline",
        f"  create+start to first exec output      {ms(single)}   {single / baseline:.2f}x baseline (goal <= 1.3x)",
        f"  one exec of `true`                     {ms(statistics.median(execs))}   "
        f"p95 {ms(pct(execs, 95))} (goal <= 60 ms)",
        f"  20 concurrent starts                   p50 {ms(p50)}  p95 {ms(p95)}  "
        f"p95 = {p95 / single:.2f}x single (goal <= 3x)",
        "  engine floor, for comparison:",
        f"    bare SDK exec of `true`              {ms(statistics.median(bare))}   p95 {ms(pct(bare, 95))}",
        f"    20 concurrent `docker run --rm`      p50 {ms(pct(cli_many, 50))}  p95 {ms(pct(cli_many, 95))}  "
        f"p95 = {pct(cli_many, 95) / baseline:.2f}x baseline",
        f"  warm pool (opt-in SandboxPool, size 20, filled in {fill_seconds:.1f}s):",
        f"    acquire to first exec output         {ms(pooled_single)}   {pooled_single / baseline:.2f}x baseline",
        f"    20 concurrent acquires               p50 {ms(pp50)}  p95 {ms(pp95)}  "
        f"p95 = {pp95 / pooled_single:.2f}x single",
    ]
    print("\n".join(lines))
