"""Custom tools (docs/tools.md), measured in one run against the real engine: an `auto` tool whose
script is `true`, called 10 times by a builtin-runtime task (a scripted model on 127.0.0.1), from
the agent's call to its result (the transcript's `tool_call` and `tool_result` events), against a
plain sandbox start in the same run (a hardened sandbox of the plain image started, `true` run in
it, removed: what a call cannot do with less). Goal: the median call <= 1.5x the median start.
Figures are printed; the goal is asserted as a ratio measured in this run."""

import asyncio
import statistics
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from forge.core.settings import Settings
from sandbox import DEFAULT_IMAGE, SandboxEngine, SandboxSpec
from tests.support.model import ScriptedModel, reply, tool_call
from tests.support.tasks import all_events, served, wait_state

CALLS = 10
TRUE_TOOL: dict[str, Any] = {
    "name": "noop",
    "description": "Does nothing",
    "parameters": {"type": "object", "properties": {}},
    "script": "true\n",
    "interpreter": "sh",
    "mode": "auto",
    "read_only": True,
    "timeout_seconds": 60,
}


def _at(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(event["at"].replace("Z", "+00:00")).timestamp()


async def _calls(settings: Settings) -> list[float]:
    script = [tool_call("custom_noop", {}, call_id=f"c{i}") for i in range(CALLS)] + [reply("done")]
    with ScriptedModel(script) as model:
        async with served(settings, model_base_url=model.url, model_name="scripted") as (_env, c):
            r = await c.post("/api/v1/repos/ana/demo/tools", json=TRUE_TOOL)
            assert r.status_code == 201, r.text
            await c.post(f"/api/v1/repos/ana/demo/tools/{r.json()['id']}/activate", json={"version": 1})
            await c.post("/api/v1/repos/ana/demo/tasks", json={"goal": "call it", "agent": "fixer"})
            done = await wait_state(c, 1, "awaiting_review", "failed", timeout=300)
            assert done["state"] == "awaiting_review", done
            events = await all_events(c, 1)
    called = {e["payload"]["id"]: _at(e) for e in events if e["kind"] == "tool_call"}
    answered = {e["payload"]["id"]: _at(e) for e in events if e["kind"] == "tool_result"}
    return [answered[i] - called[i] for i in called if i in answered]


async def _plain_starts(settings: Settings) -> list[float]:
    out = []
    async with SandboxEngine() as engine:
        for i in range(CALLS):
            with tempfile.TemporaryDirectory() as ws:
                Path(ws).chmod(0o777)
                spec = SandboxSpec(image=DEFAULT_IMAGE, workspace=Path(ws), instance=settings.instance_id or "bench",
                                   task="bench", run=f"bench-{i}")  # fmt: skip
                t0 = time.monotonic()
                box = await engine.start(spec)
                try:
                    await box.exec(["true"])
                finally:
                    await box.remove()
                out.append(time.monotonic() - t0)
    return out


def test_bench_an_auto_tool_call_against_a_plain_sandbox_start(settings: Settings) -> None:
    plain = asyncio.run(_plain_starts(settings))
    calls = asyncio.run(_calls(settings))
    assert len(calls) == CALLS
    ratio = statistics.median(calls) / statistics.median(plain)
    print(f"\nauto tool call (agent's call to result) {statistics.median(calls):.2f} s, plain sandbox start "
          f"{statistics.median(plain):.2f} s (x{ratio:.2f}, goal <= 1.5)")  # fmt: skip
    assert ratio <= 1.5
