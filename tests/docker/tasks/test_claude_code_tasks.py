"""`claude-code` tasks end to end: `forgehand serve` with its worker, the real engine, the agents
image with the real CLI 2.1.332, the run's model gateway, a scripted Anthropic server on
127.0.0.1 and a real policy consumer. The work lands on the task branch; a consumer's deny stops
a Bash call and the model reads the reason; `ask` parks and approving runs exactly that input; a
review that requests changes continues the same Claude session."""

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from forge.core.settings import Settings
from tests.support.agent_box import on_served, review_cycles, settled, settled_with_policy
from tests.support.agent_tasks import approve_with_policy
from tests.support.anthropic import ScriptedAnthropic, text, tool_use
from tests.support.policy import PolicyConsumer
from tests.support.tasks import task_settings, tree_files

pytestmark = pytest.mark.docker

KEY = "sk-ant-instance-key-claude-0123456789"
TASKS = "/api/v1/repos/ana/demo/tasks"


@pytest.fixture
def claude_settings(settings: Settings, agents_image: str) -> Settings:
    return msgspec.structs.replace(task_settings(settings), webhooks_allowed_hosts="127.0.0.1")


def with_model(s: Settings, api: ScriptedAnthropic) -> Settings:
    return msgspec.structs.replace(s, anthropic_base_url=api.url, anthropic_api_key=KEY, anthropic_model="claude-test")


def tool_results(api: ScriptedAnthropic) -> list[dict[str, Any]]:
    return [
        block
        for body in api.requests
        for m in body["messages"]
        if isinstance(m["content"], list)
        for block in m["content"]
        if block.get("type") == "tool_result"
    ]


async def test_a_claude_code_task_edits_files_and_its_commit_lands_on_the_task_branch(
    claude_settings: Settings,
) -> None:
    turns = [
        tool_use("Write", {"file_path": "/workspace/hello.txt", "content": "hello from claude\n"}, id="toolu_w"),
        tool_use("Bash", {"command": "echo appended >> /workspace/hello.txt", "description": "append"}, id="toolu_b"),
        text("I wrote hello.txt."),
    ]
    with ScriptedAnthropic(turns) as api:
        s = with_model(claude_settings, api)
        (done, events), path = await on_served(s, lambda c: settled(c, "claude-code", "write hello"))
    assert done["state"] == "awaiting_review", (done, [e["payload"] for e in events if e["kind"] == "notice"])
    files = tree_files(path, done["head_sha"])
    assert files["hello.txt"][1] == b"hello from claude\nappended\n"
    assert done["summary"] == "I wrote hello.txt."
    run = done["runs"][0]
    assert (run["agent_name"], run["agent_version"]) == ("claude-code", "2.1.332")
    assert done["agent_session_id"]
    # The real key went to the provider from the host, never into the container or the transcript.
    assert {h.get("x-api-key") for h in api.headers} == {KEY}
    assert KEY not in json.dumps(events)
    calls = [e["payload"] for e in events if e["kind"] == "tool_call"]
    assert [(c["name"], c["kind"]) for c in calls] == [("Write", "edit"), ("Bash", "execute")]
    assert any(e["kind"] == "model_call" for e in events)


def test_a_consumer_s_deny_on_bash_stops_the_call_and_the_model_reads_the_reason(
    claude_settings: Settings, tmp_path: Path
) -> None:
    def answer(body: dict[str, Any]) -> tuple[int, dict[str, Any] | None]:
        if body["type"] == "pre_tool_use" and body["data"]["tool_name"] == "Bash":
            return 200, {"permission": {"decision": "deny", "reason": "no shell for claude here"}}
        return 200, None

    consumer = PolicyConsumer()
    consumer.answer = answer  # type: ignore[method-assign]
    turns = [
        tool_use("Bash", {"command": "touch /workspace/marker", "description": "marker"}, id="toolu_deny"),
        text("The shell was refused."),
    ]
    with ScriptedAnthropic(turns) as api:
        s = with_model(claude_settings, api)
        done, events, path = settled_with_policy(s, consumer, "claude-code", "make a marker")
    assert "marker" not in tree_files(path, done["head_sha"])
    assert done["state"] == "awaiting_review", done
    denied = next(r for r in tool_results(api) if r["tool_use_id"] == "toolu_deny")
    assert denied["is_error"] is True and "no shell for claude here" in json.dumps(denied["content"])
    # One dispatch for the call although both the hook and the control channel guard it.
    assert [b["data"]["tool_use_id"] for b in consumer.seen if b["type"] == "pre_tool_use"] == ["toolu_deny"]
    [record] = [e for e in events if e["kind"] == "system" and e["payload"]["phase"] == "policy"]
    assert record["payload"]["text"].startswith("pre_tool_use: deny (")


def test_ask_parks_and_approving_runs_exactly_that_input_in_the_same_session(claude_settings: Settings) -> None:
    command = {"command": "echo approved > /workspace/approved.txt", "description": "write"}
    consumer = PolicyConsumer({"pre_tool_use": (200, {"permission": {"decision": "ask", "reason": "a person"}})})
    turns = [tool_use("Bash", command, id="toolu_ask"), tool_use("Bash", command), text("done")]
    with ScriptedAnthropic(turns, repeat_last=True) as api:
        s = with_model(claude_settings, api)

        body = {"goal": "approve me", "agent": "fixer", "runtime": "claude-code"}
        blocked, done, files = approve_with_policy(s, consumer, body, "Bash", command, timeout=180)
    assert files["approved.txt"][1] == b"approved\n"
    assert done["state"] == "awaiting_review", done
    assert [r["kind"] for r in done["runs"]] == ["start", "approval"]
    assert done["agent_session_id"] == blocked["agent_session_id"]
    # Asked once: the approved call ran without a second dispatch.
    assert len([b for b in consumer.seen if b["type"] == "pre_tool_use"]) == 1


async def test_review_change_requests_resume_the_same_session_over_two_cycles(claude_settings: Settings) -> None:
    turns = [
        tool_use("Write", {"file_path": "/workspace/hi.txt", "content": "v1\n"}),
        text("first"),
        tool_use("Write", {"file_path": "/workspace/hi.txt", "content": "v2\n"}),
        text("second"),
        tool_use("Write", {"file_path": "/workspace/hi.txt", "content": "v3\n"}),
        text("third"),
    ]
    with ScriptedAnthropic(turns) as api:
        s = with_model(claude_settings, api)
        (task, sessions), path = await on_served(s, lambda c: review_cycles(c, "claude-code", "write hi", (2, 3)))
    assert [r["kind"] for r in task["runs"]] == ["start", "review", "review"]
    assert tree_files(path, task["head_sha"])["hi.txt"][1] == b"v3\n"
    assert sessions[0] and sessions == [sessions[0]] * 3
    # The third cycle's first request carries both earlier change requests: one conversation.
    said = json.dumps(api.requests[4]["messages"])
    assert "change it, cycle 2" in said and "change it, cycle 3" in said and "write hi" in said
