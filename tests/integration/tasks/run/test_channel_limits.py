"""A run's channel limits its sandbox's hook and back-channel calls: past the burst and the rate
(or the run's cap) it answers 429 with a stable code, without calling the handler, and notes it
once in the transcript however many calls it refuses; model calls are not counted."""

import asyncio
import time
from typing import Any

from tasks.run.gateway.limits import CallLimits
from tests.support.anthropic import ScriptedAnthropic, text
from tests.support.gateway import Recorder, agent_client, open_channel, upstreams

BODY = {"tool_name": "Bash", "tool_input": {"command": "true"}, "tool_use_id": "forged"}


async def test_a_hook_flood_is_refused_past_the_burst_and_noted_once() -> None:
    handled: list[dict[str, Any]] = []

    async def hook(agent: str, event: str, body: dict[str, Any]) -> dict[str, Any]:
        handled.append(body)
        return {}

    rec = Recorder()
    limits = CallLimits(rate=2, burst=10, cap=10_000)
    async with open_channel({}, emit=rec, call_limits=limits) as ch, agent_client(ch) as c:
        ch.set_hook_handler(hook)
        h = {"authorization": f"Bearer {ch.token}"}
        connections = asyncio.Semaphore(8)  # under the channel's 16 (uvicorn answers 503 beyond)

        async def post(path: str) -> Any:
            async with connections:
                return await c.post(path, json=BODY, headers=h)

        t0 = time.monotonic()
        answers = await asyncio.gather(*(post("/hooks/claude/PreToolUse") for _ in range(40)))
        answers += await asyncio.gather(*(post("/mcp") for _ in range(10)))
        elapsed = time.monotonic() - t0
    statuses = [r.status_code for r in answers]
    # The burst, and what the rate refilled while the flood lasted (longer on a loaded machine).
    allowed = 10 + int(2 * elapsed) + 1
    assert statuses.count(200) + statuses.count(400) <= allowed, (statuses, elapsed)
    refused = [r for r in answers if r.status_code == 429]
    assert len(refused) >= 50 - allowed and len(handled) <= allowed
    assert {r.json()["code"] for r in refused} == {"run_channel_limited"}
    assert all(int(r.headers["retry-after"]) >= 1 for r in refused)
    notes = [p for k, p in rec.events if k == "notice"]
    assert len(notes) == 1 and "2 a second" in notes[0].text and notes[0].level == "warning"
    assert ch.control_calls.refused["rate"] == len(refused)


async def test_the_cap_holds_for_the_whole_run_and_model_calls_are_not_counted() -> None:
    async def hook(agent: str, event: str, body: dict[str, Any]) -> dict[str, Any]:
        return {}

    rec = Recorder()
    with ScriptedAnthropic([text("fine")], repeat_last=True) as api:
        limits = CallLimits(rate=1_000, burst=1_000, cap=3)
        ups = upstreams(anthropic_url=api.url)
        async with open_channel(ups, emit=rec, call_limits=limits) as ch, agent_client(ch) as c:
            ch.set_hook_handler(hook)
            h = {"authorization": f"Bearer {ch.token}"}
            hooks = [(await c.post("/hooks/claude/PostToolUse", json=BODY, headers=h)).status_code for _ in range(5)]
            model = {"model": "claude-test", "max_tokens": 10, "messages": []}
            calls = [(await c.post("/v1/messages", json=model, headers=h)).status_code for _ in range(4)]
            last = await c.post("/hooks/claude/PostToolUse", json=BODY, headers=h)
    assert hooks == [200, 200, 200, 429, 429] and calls == [200] * 4
    assert last.status_code == 429 and "retry-after" not in last.headers
    assert "every further one is refused" in last.json()["error"]
    assert [p.text for k, p in rec.events if k == "notice"] == [last.json()["error"] + " (429)"]
