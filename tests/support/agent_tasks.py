"""One agent task under a real policy consumer, end to end (`forgehand serve`, its worker, the real
engine): start it, wait for it to settle, read its transcript and the tree it left; or let the
consumer's `ask` park a call and approve it. For the docker tests of the CLI and ACP runtimes."""

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from forge.core.settings import Settings
from tests.support.policy import PolicyConsumer, served_with_policy
from tests.support.tasks import Env, all_events, tree_files, wait_state

TASKS = "/api/v1/repos/ana/demo/tasks"
Result = tuple[dict[str, Any], list[dict[str, Any]], dict[str, tuple[int, bytes]]]


def run_with_policy(
    s: Settings,
    consumer: PolicyConsumer,
    body: dict[str, Any],
    *,
    before: Callable[[Env], Awaitable[None]] | None = None,
    timeout: float = 240,
) -> Result:
    """The settled task, its transcript and its tree (the head's, else the base's)."""

    async def check(env: Env) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        if before is not None:
            await before(env)
        async with env.client() as c:
            r = await c.post(TASKS, json=body)
            assert r.status_code == 201, r.text
            return await wait_state(c, 1, "awaiting_review", "failed", timeout=timeout), await all_events(c, 1)

    for env in served_with_policy(s, consumer, ["pre_tool_use"]):
        done, events = asyncio.run(check(env))
        files = tree_files(env.repo_path, done["head_sha"] or done["base_sha"])
    return done, events, files


def approve_with_policy(
    s: Settings, consumer: PolicyConsumer, body: dict[str, Any], tool_name: str, tool_input: Any, timeout: float = 240
) -> tuple[dict[str, Any], dict[str, Any], dict[str, tuple[int, bytes]]]:
    """The task blocked on the parked call (checked to be exactly `tool_name` with `tool_input`),
    then settled after a person approved it, and the tree it left."""

    async def check(env: Env) -> tuple[dict[str, Any], dict[str, Any]]:
        async with env.client() as c:
            r = await c.post(TASKS, json=body)
            assert r.status_code == 201, r.text
            blocked = await wait_state(c, 1, "blocked", "failed", "awaiting_review", timeout=timeout)
            assert blocked["state"] == "blocked", blocked
            parked = blocked["pending_approval"]
            assert parked["tool_name"] == tool_name and parked["tool_input"] == tool_input
            url = f"{TASKS}/1/approvals/{parked['id']}"
            r = await c.post(url, json={"decision": "approve", "input_hash": parked["input_hash"]})
            assert r.status_code == 200, r.text
            return blocked, await wait_state(c, 1, "awaiting_review", "failed", timeout=timeout)

    for env in served_with_policy(s, consumer, ["pre_tool_use"]):
        blocked, done = asyncio.run(check(env))
        files = tree_files(env.repo_path, done["head_sha"])
    return blocked, done, files
