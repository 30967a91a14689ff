"""The run's watchdogs end to end (real engine, real git, a real HTTP server), with small limits:
the idle limit (a notice first, then `idle`), the per-command timeout and the wall-clock limit
(`timeout`), and the token budget of the builtin runtime against the scripted model (`token_budget`)."""

import asyncio
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from forge.core.settings import Settings
from tests.support.model import ScriptedModel, tool_call
from tests.support.tasks import (
    Env,
    all_events,
    containers_of,
    seed,
    serve,
    task_settings,
    tree_files,
    wait_state,
)

pytestmark = pytest.mark.docker


async def run_to_rest(settings: Settings, body: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]], Env]:
    """Start one task on a fresh server and return it once it rests, with its whole transcript."""
    token, path = await asyncio.to_thread(lambda: asyncio.run(seed(settings)))
    out: tuple[dict[str, Any], list[dict[str, Any]], Env] | None = None
    for url in serve(settings):
        env = Env(url=url, settings=settings, token=token, repo_path=path)
        async with env.client() as c:
            r = await c.post("/api/v1/repos/ana/demo/tasks", json={"goal": "do it", "agent": "fixer", **body})
            assert r.status_code == 201, r.text
            done = await wait_state(c, 1, "failed", "stopped", "awaiting_review", "blocked", timeout=90)
            out = (done, await all_events(c, 1), env)
    assert out is not None
    return out


def notices(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e["kind"] == "notice"]


def assert_gap_free(events: list[dict[str, Any]]) -> None:
    seqs = [e["seq"] for e in events]
    assert seqs == list(range(1, len(seqs) + 1))


async def test_idle_watchdog_warns_then_stops_the_run_as_idle(settings: Settings, sandbox_image: str) -> None:
    idle = 3.0
    s = task_settings(settings, task_idle_seconds=idle)
    t0 = time.monotonic()
    done, events, env = await run_to_rest(s, {"command": "echo begun > wip.txt; echo begun; sleep 120"})
    assert time.monotonic() - t0 < 60  # well before the command's own end
    assert done["state"] == "failed" and done["failure_reason"] == "idle", done
    assert "idle" in done["error"]
    run = done["runs"][0]
    assert run["state"] == "failed" and run["failure_reason"] == "idle"
    assert_gap_free(events)
    # A warning notice first, after the last output, and only then the run stops.
    begun = next(e for e in events if e["kind"] == "stdout" and "begun" in e["payload"]["text"])
    warning = next(
        e for e in notices(events) if e["payload"]["level"] == "warning" and "no activity" in e["payload"]["text"]
    )
    assert warning["seq"] > begun["seq"]
    assert f"stops at {idle:g} s" in warning["payload"]["text"]
    removed = next(e for e in events if e["kind"] == "system" and e["payload"]["phase"] == "sandbox_removed")
    assert removed["seq"] > warning["seq"]
    # The notice came between two thirds of the limit and the limit itself, the stop after the limit.
    begun_at, warned_at = _at(begun), _at(warning)
    assert idle * 2 / 3 - 0.2 <= warned_at - begun_at <= idle + 0.5
    assert any(e["payload"]["level"] == "error" and "idle" in e["payload"]["text"] for e in notices(events))
    # Nothing done is lost: the work so far is a WIP snapshot on the task branch; no container is left.
    assert done["head_is_wip"] and tree_files(env.repo_path, done["head_sha"])["wip.txt"][1] == b"begun\n"
    assert not containers_of(env.settings)


async def test_command_timeout_ends_the_run_as_timeout(settings: Settings, sandbox_image: str) -> None:
    s = task_settings(settings, task_tool_timeout_seconds=2.0)
    t0 = time.monotonic()
    done, events, env = await run_to_rest(s, {"command": "echo partial > wip.txt; echo started; sleep 120"})
    assert time.monotonic() - t0 < 60
    assert done["state"] == "failed" and done["failure_reason"] == "timeout", done
    assert "within 2 s" in done["error"]
    assert done["runs"][0]["failure_reason"] == "timeout"
    assert_gap_free(events)
    assert "started" in "".join(e["payload"]["text"] for e in events if e["kind"] == "stdout")
    assert done["head_is_wip"] and "wip.txt" in tree_files(env.repo_path, done["head_sha"])
    assert not containers_of(env.settings)


async def test_wall_clock_limit_ends_the_run_as_timeout(settings: Settings, sandbox_image: str) -> None:
    # Output keeps coming (the idle watchdog stays quiet) and each command is short of its own timeout.
    s = task_settings(settings, task_wall_clock_seconds=4, task_idle_seconds=30.0, task_tool_timeout_seconds=60.0)
    t0 = time.monotonic()
    done, events, env = await run_to_rest(
        s, {"command": "echo partial > wip.txt; while true; do echo tick; sleep 0.5; done"}
    )
    assert time.monotonic() - t0 < 60
    assert done["state"] == "failed" and done["failure_reason"] == "timeout", done
    assert "wall-clock" in done["error"], done["error"]
    assert done["runs"][0]["failure_reason"] == "timeout"
    assert_gap_free(events)
    ticks = "".join(e["payload"]["text"] for e in events if e["kind"] == "stdout").count("tick")
    assert 2 <= ticks <= 12, ticks
    assert done["head_is_wip"] and "wip.txt" in tree_files(env.repo_path, done["head_sha"])
    assert not containers_of(env.settings)


async def test_token_budget_ends_the_run_as_token_budget(settings: Settings, sandbox_image: str) -> None:
    # Every scripted turn costs 15 tokens (10 prompt + 5 completion): a budget of 40 is passed on turn 3.
    with ScriptedModel([tool_call("bash", {"command": "echo again >> loop.txt"})], repeat_last=True) as model:
        s = task_settings(settings, model_base_url=model.url, model_name="scripted", task_token_budget=40)
        done, events, env = await run_to_rest(s, {"goal": "loop"})
    assert done["state"] == "failed" and done["failure_reason"] == "token_budget", done
    assert "token budget of 40 exceeded" in done["error"]
    run = done["runs"][0]
    assert run["failure_reason"] == "token_budget" and run["turns"] == 3
    assert run["prompt_tokens"] + run["completion_tokens"] == 45
    assert len(model.requests) == 3
    assert_gap_free(events)
    # The third turn's tool call was never run: two appends made it to the WIP snapshot.
    assert done["head_is_wip"] and tree_files(env.repo_path, done["head_sha"])["loop.txt"][1] == b"again\n" * 2
    assert not containers_of(env.settings)


def _mounts_under(path: Path) -> list[str]:
    with open("/proc/self/mountinfo", encoding="utf-8") as fh:
        return [line.split()[4] for line in fh if line.split()[4].startswith(str(path.resolve()))]


async def test_a_disk_filler_ends_the_run_as_disk_limit_without_filling_the_host(
    settings: Settings, sandbox_image: str
) -> None:
    s = task_settings(settings, task_workspace_limit_mb=64)
    t0 = time.monotonic()
    command = "echo partial > wip.txt; dd if=/dev/zero of=big bs=1M count=700; echo rc=$?; sleep 120"
    done, events, env = await run_to_rest(s, {"command": command})
    assert time.monotonic() - t0 < 60  # the watch ended it, not the sleep
    assert done["state"] == "failed" and done["failure_reason"] == "disk_limit", done
    assert "limit of 64 MiB" in done["error"]
    assert done["runs"][0]["failure_reason"] == "disk_limit"
    assert_gap_free(events)
    assert "No space left on device" in "".join(e["payload"]["text"] for e in events if e["kind"] == "stderr")
    workspace = next(e for e in events if e["kind"] == "system" and e["payload"]["phase"] == "workspace")
    assert workspace["payload"]["detail"]["quota"] == "mount" and workspace["payload"]["detail"]["limit_mb"] == 64
    assert any(e["payload"]["level"] == "error" and "disk_limit" in e["payload"]["text"] for e in notices(events))
    # The work so far is a WIP snapshot (the filler itself is over the file size cap and left out).
    files = tree_files(env.repo_path, done["head_sha"])
    assert done["head_is_wip"] and files["wip.txt"][1] == b"partial\n" and "big" not in files
    # Cleanup: no container, no mount, no image file left under the data dir.
    assert not containers_of(env.settings)
    assert not _mounts_under(s.data_dir)
    assert not list((s.data_dir / "workspaces").rglob("*.img"))


async def test_a_run_under_the_workspace_limit_is_unaffected(settings: Settings, sandbox_image: str) -> None:
    s = task_settings(settings, task_workspace_limit_mb=64)
    command = "head -c 20M /dev/urandom > blob.bin; rm blob.bin; df -B1M . | tail -1; echo done > out.txt"
    done, events, env = await run_to_rest(s, {"command": command})
    assert done["state"] == "awaiting_review", done
    assert tree_files(env.repo_path, done["head_sha"])["out.txt"][1] == b"done\n"
    df = "".join(e["payload"]["text"] for e in events if e["kind"] == "stdout").split()
    assert int(df[1]) <= 64  # the sandbox saw its own 64 MiB filesystem
    assert not _mounts_under(s.data_dir) and not list((s.data_dir / "workspaces").rglob("*.img"))


def _at(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(event["at"].replace("Z", "+00:00")).timestamp()
