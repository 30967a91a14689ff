"""A `claude-code` task against a real `forgehand serve` (its in-process worker, the real Docker
engine, the agents image, the run's model gateway) and a scripted Anthropic server on 127.0.0.1.

Measured in one run: the time from `POST .../tasks` to the agent's first model request reaching
the scripted server, against `docker run --rm` of the agents image starting the same CLI pointed
straight at the server (the container start plus the CLI's own start to its first request).
Goal: at most 1.5x. Twice: a server without the warm pool, then one with
`FORGEHAND_TASK_SANDBOX_POOL=2`, each after its own baselines, each task SPACING seconds after the
last one ended (so that no task starts inside the previous one's cleanup and the pool's refill,
which compete for the CPU on a small machine); every figure is printed (never
asserted as a wall-clock limit), with how many runs got a pooled sandbox. After each server stops,
nothing of its sandboxes (containers, pool slot directories) may be left.

Run: `make bench` (or `pytest -q -s tests/bench/bench_agents.py -o python_files='bench_*.py'`)."""

import asyncio
import statistics
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import docker
import httpx
import pytest

from sandbox import DEFAULT_AGENTS_IMAGE
from tests.support.anthropic import ScriptedAnthropic, text
from tests.support.ports import free_port
from tests.support.serve_process import prepare, serving

TASKS = "/api/v1/repos/ana/demo/tasks"
RUNS = 5
POOL = 2
SPACING = 6.0  # seconds between one task's end and the next POST
RESTING = {"awaiting_review", "failed", "stopped", "blocked", "closed", "merged"}


def ms(seconds: float) -> str:
    return f"{seconds * 1000:,.0f} ms"


async def first_request(api: ScriptedAnthropic, seen: int, t0: float, timeout: float = 120) -> float:
    while len(api.requests) <= seen:
        if time.perf_counter() - t0 > timeout:
            raise AssertionError("the agent never called the model")
        await asyncio.sleep(0.005)
    return time.perf_counter() - t0


async def docker_baseline(api: ScriptedAnthropic, *limits: str) -> float:
    """`docker run` of the agents image + the CLI's start, to its first model request."""
    seen = len(api.requests)
    argv = [
        "docker", "run", "--rm", "-i", *limits, "--network", "host", "--read-only",
        "--tmpfs", "/home/agent:uid=1000,gid=1000",
        "--tmpfs", "/tmp", "-e", "HOME=/home/agent", "-e", f"ANTHROPIC_BASE_URL={api.url}",
        "-e", "ANTHROPIC_AUTH_TOKEN=fhr_bench", "-e", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1",
        "-e", "DISABLE_AUTOUPDATER=1", DEFAULT_AGENTS_IMAGE,
        "/usr/local/bin/claude", "-p", "--output-format", "stream-json", "--verbose", "--model", "claude-bench", "hi",
    ]  # fmt: skip
    t0 = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL, stdin=asyncio.subprocess.DEVNULL
    )
    took = await first_request(api, seen, t0)
    await proc.wait()
    return took


class Figures:
    """What one server's tasks measured (POST -> first model request, phases, pooled sandboxes)."""

    def __init__(self) -> None:
        self.first: list[float] = []
        self.phases: dict[str, list[int]] = {}
        self.offsets: dict[str, list[float]] = {}
        self.pooled = 0


async def tasks(client: httpx.AsyncClient, api: ScriptedAnthropic, runs: int = RUNS) -> Figures:
    out = Figures()
    for i in range(runs + 1):  # the first one warms up
        # A user's next task comes some time after the last one ended, not within its cleanup and
        # the pool's refill (REFILL_DELAY_SECONDS): the same pause in both modes.
        await asyncio.sleep(SPACING)
        seen = len(api.requests)
        t0 = time.perf_counter()
        wall0 = time.time()
        r = await client.post(TASKS, json={"goal": "say hi", "agent": "fixer", "runtime": "claude-code"})
        assert r.status_code == 201, r.text
        took = await first_request(api, seen, t0)
        number = r.json()["number"]
        while True:
            task = (await client.get(f"{TASKS}/{number}")).json()
            if task["state"] in RESTING:
                break
            await asyncio.sleep(0.1)
        assert task["state"] == "awaiting_review", task
        if i:
            out.first.append(took)
            page = (await client.get(f"{TASKS}/{number}/transcript", params={"limit": 1000})).json()
            for e in page["events"]:
                if e["kind"] != "system":
                    continue
                payload = e["payload"]
                at = datetime.fromisoformat(e["at"].replace("Z", "+00:00")).timestamp() - wall0
                out.offsets.setdefault(payload["phase"], []).append(at * 1000)
                if payload.get("duration_ms") is not None:
                    out.phases.setdefault(payload["phase"], []).append(payload["duration_ms"])
                if payload["phase"] == "sandbox" and (payload.get("detail") or {}).get("pooled"):
                    out.pooled += 1
    return out


def report(label: str, figures: Figures, base: float, limited: float) -> str:
    f = statistics.median(figures.first)
    return (
        f"\n{label}: POST -> first model request, median of {len(figures.first)}: {ms(f)}"
        f" (each: {', '.join(ms(x) for x in figures.first)}); {figures.pooled} of {len(figures.first)} sandboxes"
        f" from the warm pool\n    ratio {f / base:.2f} against `docker run` + the CLI's start"
        f" (goal <= 1.5){'' if f / base <= 1.5 else '  -- MISSES THE GOAL'};"
        f" {f / limited:.2f} against `docker run --cpus 1`"
        "\n    phases (median ms): "
        + ", ".join(f"{k} {statistics.median(v):.0f}" for k, v in figures.phases.items())
        + "\n    each phase's event after the POST (median ms): "
        + ", ".join(f"{k} {statistics.median(v):.0f}" for k, v in figures.offsets.items())
    )


async def baselines(api: ScriptedAnthropic) -> tuple[list[float], list[float]]:
    plain = [await docker_baseline(api) for _ in range(RUNS + 1)][1:]
    # The same with the sandbox's CPU limit (one CPU): the CLI's own start is CPU-bound.
    limited = [await docker_baseline(api, "--cpus", "1") for _ in range(RUNS)]
    return plain, limited


def left_behind(engine: docker.DockerClient, settings: Any) -> list[str]:
    """Containers of the instance, and pool slot directories, the server left after it stopped."""
    left = engine.containers.list(all=True, filters={"label": f"forgehand.instance={settings.instance_id}"})
    for c in left:
        c.remove(force=True)
    pool_root = Path(settings.data_dir) / "pool"
    slots = [str(p) for p in pool_root.glob("*")] if pool_root.is_dir() else []
    channels = settings.effective_run_channel_dir
    slots += [str(p) for p in channels.glob("pool-*")] if channels.is_dir() else []
    return [c.name for c in left] + slots


def test_bench_agents(tmp_path: Path) -> None:
    engine = docker.from_env()
    try:
        engine.images.get(DEFAULT_AGENTS_IMAGE)
    except docker.errors.ImageNotFound:
        pytest.fail(f"no agents image {DEFAULT_AGENTS_IMAGE}: run `forgehand sandbox build --agents`", pytrace=False)
    port = free_port()
    settings, token = asyncio.run(prepare(tmp_path, port))
    left: list[str] = []
    lines: list[str] = []
    plain: list[float] = []
    limited: list[float] = []
    results: dict[str, Figures] = {}
    with ScriptedAnthropic([text("hi")], repeat_last=True) as api:
        model = {
            "FORGEHAND_ANTHROPIC_BASE_URL": api.url,
            "FORGEHAND_ANTHROPIC_API_KEY": "sk-ant-bench-key",
            "FORGEHAND_ANTHROPIC_MODEL": "claude-bench",
        }
        try:
            # Without the pool, then with it (a fresh server each), each after its own baselines.
            for label, pool in (("without the pool", "0"), (f"with FORGEHAND_TASK_SANDBOX_POOL={POOL}", str(POOL))):
                p, lim = asyncio.run(baselines(api))
                plain += p
                limited += lim
                with serving(settings, port, FORGEHAND_TASK_SANDBOX_POOL=pool, **model):

                    async def main(pool: str = pool) -> Figures:
                        headers = {"Authorization": f"Bearer {token}"}
                        base = f"http://127.0.0.1:{port}"
                        async with httpx.AsyncClient(base_url=base, headers=headers, timeout=120) as client:
                            return await tasks(client, api)

                    results[label] = asyncio.run(main())
                left += left_behind(engine, settings)
        finally:
            left += left_behind(engine, settings)
            engine.close()
    base, lim = statistics.median(plain), statistics.median(limited)
    lines.append(
        f"\nclaude-code task against `docker run` of {DEFAULT_AGENTS_IMAGE} + the CLI's start -> first request:"
        f" median {ms(base)} (each: {', '.join(ms(x) for x in plain)}); with `--cpus 1` {ms(lim)}"
    )
    lines += [report(label, figures, base, lim) for label, figures in results.items()]
    print("".join(lines))
    assert not left, f"left behind after the server stopped: {left}"
