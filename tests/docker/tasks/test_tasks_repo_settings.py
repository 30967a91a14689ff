"""A repository's own limits apply to its runs (here: the per-command timeout)."""

import asyncio

import pytest

from forge.core.settings import Settings
from tests.support.tasks import Env, seed, serve, task_settings, wait_state

pytestmark = pytest.mark.docker


def test_repository_timeout_overrides_the_instance(settings: Settings, sandbox_image: str) -> None:
    s = task_settings(settings, task_tool_timeout_seconds=600.0)
    token, path = asyncio.run(seed(s))

    async def check(env: Env) -> dict[str, object]:
        async with env.client() as c:
            # the seeded token of the owner lacks nothing for this: owners are repository admins
            r = await c.put("/api/v1/repos/ana/demo/task-settings", json={"tool_timeout_seconds": 2})
            assert r.status_code == 200, r.text
            r = await c.post(
                "/api/v1/repos/ana/demo/tasks",
                json={"goal": "wait", "agent": "fixer", "runtime": "command", "command": "sleep 30"},
            )
            assert r.status_code == 201, r.text
            return await wait_state(c, 1, "failed", "awaiting_review", timeout=60)

    for url in serve(s):
        done = asyncio.run(check(Env(url=url, settings=s, token=token, repo_path=path)))
    assert done["failure_reason"] == "timeout", done
    assert "within 2 s" in str(done["error"])
