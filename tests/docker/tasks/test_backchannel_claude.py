"""The back-channel of a claude-code task in the agents image: the real CLI reaches forgehand's MCP
server at 127.0.0.1:4100 inside the container (the sandbox's gateway relay to the run's socket)
with the run token; progress and a reported summary land on the task; ask_user with options
blocks it, the options show on the task, and the answer continues the same Claude session."""

import json

import pytest

from forge.core.settings import Settings
from tests.support.anthropic import ScriptedAnthropic, text, tool_use, turn
from tests.support.tasks import all_events, served, wait_state

pytestmark = pytest.mark.docker

KEY = "sk-ant-instance-key-claude-0123456789"
TASKS = "/api/v1/repos/ana/demo/tasks"


async def test_a_claude_code_agent_uses_the_back_channel_from_its_container(
    settings: Settings, agents_image: str
) -> None:
    turns = [
        turn(
            tool_use("mcp__forgehand__record_progress", {"message": "read the code"}, id="toolu_p"),
            tool_use("mcp__forgehand__report_summary", {"summary": "Reported by claude."}, id="toolu_s"),
        ),
        tool_use("mcp__forgehand__ask_user", {"question": "Which colour?", "options": ["red", "blue"]}, id="toolu_q"),
        text("Used blue."),
    ]
    with ScriptedAnthropic(turns) as api:
        model = {"anthropic_base_url": api.url, "anthropic_api_key": KEY, "anthropic_model": "claude-test"}
        async with served(settings, **model) as (_, c):
            r = await c.post(TASKS, json={"goal": "paint", "agent": "fixer", "runtime": "claude-code"})
            assert r.status_code == 201, r.text
            blocked = await wait_state(c, 1, "blocked", "awaiting_review", "failed", timeout=180)
            events = await all_events(c, 1)
            assert blocked["state"] == "blocked", (blocked, [e["payload"] for e in events if e["kind"] == "notice"])
            r = await c.post(f"{TASKS}/1/answer", json={"body": "blue"})
            assert r.status_code == 200, r.text
            done = await wait_state(c, 1, "awaiting_review", "failed", timeout=180)
            events = await all_events(c, 1)
    assert blocked["question"] == "Which colour?" and blocked["question_options"] == ["red", "blue"]
    first = blocked["runs"][0]
    assert first["summary"] == "Reported by claude." and first["summary_reported"] is True
    assert [e["payload"]["text"] for e in events if e["kind"] == "progress"] == ["read the code"]
    results = {
        b["tool_use_id"]: b
        for body in api.requests
        for m in body["messages"]
        if isinstance(m["content"], list)
        for b in m["content"]
        if b.get("type") == "tool_result"
    }
    assert "summary recorded" in json.dumps(results["toolu_s"]["content"])
    assert "noted" in json.dumps(results["toolu_p"]["content"])
    # The same session continued with the answer.
    assert done["state"] == "awaiting_review" and done["summary"] == "Used blue.", done
    assert [r["kind"] for r in done["runs"]] == ["start", "answer"]
    assert "The user answered your question: blue" in json.dumps(api.requests[-1]["messages"][-1])
    # The MCP tools were in the CLI's tool list (the server answered tools/list through the relay).
    offered = {t["name"] for t in api.requests[0]["tools"]}
    assert {"mcp__forgehand__ask_user", "mcp__forgehand__spawn_subtask"} <= offered
