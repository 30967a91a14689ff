"""Helpers for the CLI agent tests in the agents image: killing the agent's process mid-turn, a
seeded `forgehand serve` to drive, one task run to its rest, and a task driven through review
cycles (each a request for changes that resumes the agent's session)."""

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx

from forge.core.settings import Settings
from sandbox import Sandbox
from tests.support.policy import PolicyConsumer, served_with_policy
from tests.support.tasks import Env, all_events, seed, serve, wait_state, wait_task

T = TypeVar("T")

TASKS = "/api/v1/repos/ana/demo/tasks"


async def running(sb: Sandbox, prefix: str) -> bool:
    """Whether a process in the sandbox has a command line (its arguments joined by spaces) that
    starts with `prefix`."""
    script = (
        "for p in /proc/[0-9]*; do"
        f" case \"$(tr '\\0' ' ' < $p/cmdline 2>/dev/null)\" in '{prefix}'*) echo found;; esac; done"
    )
    result = await sb.exec(["sh", "-c", script], timeout=30)
    return b"found" in result.stdout


async def kill_by_cmdline(sb: Sandbox, prefix: str) -> bool:
    """SIGKILL every process in the sandbox whose command line starts with `prefix`."""
    script = (
        f"for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null | grep -q '^{prefix}'"
        " && kill -9 ${p#/proc/} && echo killed; done"
    )
    result = await sb.exec(["sh", "-c", script], timeout=30)
    return b"killed" in result.stdout


async def review_cycles(
    c: httpx.AsyncClient, runtime: str, goal: str, cycles: tuple[int, ...]
) -> tuple[dict[str, Any], list[str]]:
    """Start task 1 with `runtime`, then request changes once per cycle ("change it, cycle N"),
    each time waiting for the task to be back in review; the task and its session id after each run."""
    r = await c.post(TASKS, json={"goal": goal, "agent": "fixer", "runtime": runtime})
    assert r.status_code == 201, r.text
    task = await wait_state(c, 1, "awaiting_review", "failed", timeout=180)
    sessions = [task["agent_session_id"]]
    for cycle in cycles:
        review = {"verdict": "request_changes", "body": f"change it, cycle {cycle}"}
        r = await c.post(f"{TASKS}/1/reviews", json=review)
        assert r.status_code == 201, r.text
        # The review run may not have started yet: wait for it, ended.
        task = await wait_task(
            c,
            1,
            lambda t, n=cycle: t["state"] in ("awaiting_review", "failed") and len(t["runs"]) >= n,
            what=f"run {cycle} to end",
            timeout=180,
        )
        assert task["state"] == "awaiting_review", task
        sessions.append(task["agent_session_id"])
    return task, sessions


async def on_served(s: Settings, drive: Callable[[httpx.AsyncClient], Awaitable[T]]) -> tuple[T, Path]:
    """The seeded world served with `s`: what `drive` returns with a client as ana, and the repository."""
    token, path = await asyncio.to_thread(lambda: asyncio.run(seed(s)))
    for url in serve(s):
        async with Env(url=url, settings=s, token=token, repo_path=path).client() as c:
            result = await drive(c)
    return result, path


async def settled(c: httpx.AsyncClient, runtime: str, goal: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Task 1 started with `runtime`, once it rests (in review or failed), and its transcript."""
    r = await c.post(TASKS, json={"goal": goal, "agent": "fixer", "runtime": runtime})
    assert r.status_code == 201, r.text
    return await wait_state(c, 1, "awaiting_review", "failed", timeout=180), await all_events(c, 1)


def settled_with_policy(
    s: Settings, consumer: PolicyConsumer, runtime: str, goal: str, events: tuple[str, ...] = ("pre_tool_use",)
) -> tuple[dict[str, Any], list[dict[str, Any]], Path]:
    """Task 1 (`runtime`) run to its rest on a server whose repository has `consumer` as its policy
    endpoint for `events`: the task, its transcript and the repository."""
    for env in served_with_policy(s, consumer, list(events)):

        async def check(env: Env = env) -> tuple[dict[str, Any], list[dict[str, Any]]]:
            async with env.client() as c:
                return await settled(c, runtime, goal)

        done, transcript = asyncio.run(check())
        path = env.repo_path
    return done, transcript, path
