"""`codex` tasks end to end: `forgehand serve` with its worker, the real engine, the agents image
with the real Codex CLI 0.171.0, the run's model gateway (OpenAI Responses), a scripted Responses
server on 127.0.0.1 and a real policy consumer. The work lands on the task branch with the real
key nowhere in the container; a consumer's deny stops a shell call and the model reads the reason;
a review that requests changes continues the same Codex thread."""

import asyncio
import json
import time
from typing import Any

import msgspec
import pytest

from forge.core.settings import Settings
from tests.support.agent_box import on_served, review_cycles, settled, settled_with_policy
from tests.support.codex import add_file
from tests.support.codex_acp import exec_command, three_cycles
from tests.support.openai_responses import ScriptedResponses, custom_tool_call, text
from tests.support.policy import PolicyConsumer, served_with_policy
from tests.support.tasks import Env, task_settings, tree_files, wait_state

pytestmark = pytest.mark.docker

KEY = "sk-openai-instance-key-codex-0123456789"
TASKS = "/api/v1/repos/ana/demo/tasks"
MODEL = "gpt-5.5"  # a model Codex knows: it offers apply_patch


@pytest.fixture
def codex_settings(settings: Settings, agents_image: str) -> Settings:
    return msgspec.structs.replace(task_settings(settings), webhooks_allowed_hosts="127.0.0.1")


def with_model(s: Settings, api: ScriptedResponses) -> Settings:
    return msgspec.structs.replace(s, model_base_url=api.url, model_api_key=KEY, model_name=MODEL)


def told(api: ScriptedResponses) -> dict[str, str]:
    """What the model was told of each call (call id -> output), from the requests it got."""
    out: dict[str, str] = {}
    for body in api.requests:
        for item in body.get("input") or []:
            if item.get("type") in ("function_call_output", "custom_tool_call_output"):
                out[item["call_id"]] = str(item.get("output"))
    return out


async def test_a_codex_task_edits_files_its_commit_lands_and_the_key_stays_on_the_host(
    codex_settings: Settings,
) -> None:
    # The scan is written so that its own command line does not hold the key.
    half = len(KEY) // 2
    scan = (
        f'k="{KEY[:half]}""{KEY[half:]}"; '
        'n=$(grep -l -a -F -- "$k" /proc/[0-9]*/environ 2>/dev/null | wc -l); '
        'w=$(grep -r -l -a -F -- "$k" /workspace "$HOME" 2>/dev/null | wc -l); '
        'e=$(env | grep -c -F -- "$k"); echo "environ=$n files=$w env=$e" > /tmp/scan; cat /tmp/scan'
    )
    turns = [
        custom_tool_call("apply_patch", add_file("/workspace/hello.txt", "hello from codex"), "call_patch"),
        exec_command("echo appended >> /workspace/hello.txt", "call_append"),
        exec_command(scan, "call_scan"),
        text("I wrote hello.txt.", input_tokens=50, output_tokens=7),
    ]
    with ScriptedResponses(turns) as api:
        s = with_model(codex_settings, api)
        (done, events), path = await on_served(s, lambda c: settled(c, "codex", "write hello"))
    assert done["state"] == "awaiting_review", (done, [e["payload"] for e in events if e["kind"] == "notice"])
    files = tree_files(path, done["head_sha"])
    assert files["hello.txt"][1] == b"hello from codex\nappended\n"
    assert done["summary"] == "I wrote hello.txt."
    run = done["runs"][0]
    assert (run["agent_name"], run["agent_version"]) == ("codex", "0.171.0")
    assert run["model_provider"] == "openai" and run["model_key"] == "instance"
    assert done["agent_session_id"]
    # The real key went to the provider from the host, never into the container or the transcript.
    assert {h.get("authorization") for h in api.headers} == {f"Bearer {KEY}"}
    assert told(api)["call_scan"].strip().endswith("environ=0 files=0 env=0")
    assert KEY not in json.dumps(events)
    # Usage metered by the gateway: every model call, on the run and as transcript events.
    assert run["usage"]["input_tokens"] == 10 * 3 + 50 and run["usage"]["output_tokens"] == 5 * 3 + 7
    assert len([e for e in events if e["kind"] == "model_call"]) == 4
    calls = [
        (e["payload"]["id"], e["payload"]["name"], e["payload"]["kind"]) for e in events if e["kind"] == "tool_call"
    ]
    assert calls == [
        ("call_patch", "apply_patch", "edit"),
        ("call_append", "Bash", "execute"),
        ("call_scan", "Bash", "execute"),
    ]


def test_a_consumer_s_deny_on_a_shell_call_stops_it_and_the_model_reads_the_reason(codex_settings: Settings) -> None:
    def answer(body: dict[str, Any]) -> tuple[int, dict[str, Any] | None]:
        if body["type"] == "pre_tool_use" and body["data"]["tool_name"] == "Bash":
            return 200, {"permission": {"decision": "deny", "reason": "no shell for codex here"}}
        return 200, None

    consumer = PolicyConsumer()
    consumer.answer = answer  # type: ignore[method-assign]
    turns = [exec_command("touch /workspace/marker", "call_deny"), text("The shell was refused.")]
    with ScriptedResponses(turns) as api:
        s = with_model(codex_settings, api)
        done, events, path = settled_with_policy(s, consumer, "codex", "make a marker")
    assert "marker" not in tree_files(path, done["head_sha"])
    assert done["state"] == "awaiting_review", done
    assert "no shell for codex here" in told(api)["call_deny"]
    pre = [b["data"] for b in consumer.seen if b["type"] == "pre_tool_use"]
    assert [(d["tool_use_id"], d["tool_name"], d["tool_input"]) for d in pre] == [
        ("call_deny", "Bash", {"command": "touch /workspace/marker"})
    ]
    [record] = [e for e in events if e["kind"] == "system" and e["payload"]["phase"] == "policy"]
    assert record["payload"]["text"].startswith("pre_tool_use: deny (")
    # The refused call is in the transcript although Codex leaves it out of its stream.
    [result] = [e["payload"] for e in events if e["kind"] == "tool_result" and e["payload"]["id"] == "call_deny"]
    assert result["is_error"] and "no shell for codex here" in result["output"]


def test_a_consumer_hanging_past_the_deadline_denies_the_call_and_fails_the_run_closed(
    codex_settings: Settings,
) -> None:
    class Hanging(PolicyConsumer):
        def answer(self, body: dict[str, Any]) -> tuple[int, dict[str, Any] | None]:
            if body["type"] == "pre_tool_use":
                time.sleep(8)  # past the dispatch deadline (5 s)
            return 200, None

    consumer = Hanging()
    turns = [exec_command("touch /workspace/late-marker", "call_late"), text("should not matter")]
    with ScriptedResponses(turns, repeat_last=True) as api:
        s = with_model(codex_settings, api)

        async def check(env: Env) -> dict[str, Any]:
            async with env.client() as c:
                r = await c.post(TASKS, json={"goal": "make a marker", "agent": "fixer", "runtime": "codex"})
                assert r.status_code == 201, r.text
                return await wait_state(c, 1, "awaiting_review", "failed", timeout=180)

        for env in served_with_policy(s, consumer, ["pre_tool_use"]):
            done = asyncio.run(check(env))
            assert not (done.get("head_sha") and "late-marker" in tree_files(env.repo_path, done["head_sha"]))
    assert done["state"] == "failed", done
    assert done["runs"][0]["failure_reason"] == "policy", done["runs"][0]
    assert "blocked by PreToolUse hook" in told(api)["call_late"]  # refused, never run


async def test_review_change_requests_resume_the_same_thread_over_two_cycles(codex_settings: Settings) -> None:
    turns = three_cycles()
    with ScriptedResponses(turns) as api:
        s = with_model(codex_settings, api)
        (task, threads), path = await on_served(s, lambda c: review_cycles(c, "codex", "write hi", (2, 3)))
    assert [r["kind"] for r in task["runs"]] == ["start", "review", "review"]
    assert tree_files(path, task["head_sha"])["hi.txt"][1] == b"v3\n"
    assert threads[0] and threads == [threads[0]] * 3
    # The third cycle's first request carries both earlier change requests: one conversation.
    said = json.dumps(api.requests[4]["input"])
    assert "change it, cycle 2" in said and "change it, cycle 3" in said and "write hi" in said
