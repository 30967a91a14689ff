"""Custom tools called by an agent, end to end (docs/tools.md): the builtin runtime against a
scripted model on 127.0.0.1, the real engine, real git. An `auto` tool runs at once in a container
of its own, its inputs arriving literally; an invalid call reaches the agent as an error naming the
parameter and runs nothing; an `approval` tool waits until a person approves exactly its inputs;
every call is a `pre_tool_use` named `custom_<name>` with the version and the validated inputs,
and a consumer's deny reaches the agent with its reason."""

import json
from typing import Any

import httpx
import pytest

from forge.core.settings import Settings
from tasks.run.tool_exec import LABEL_TOOL_RUN
from tests.support.anthropic import ScriptedAnthropic, text, tool_use
from tests.support.model import ScriptedModel, reply, tool_call
from tests.support.policy import PolicyConsumer, make_hook_token
from tests.support.tasks import all_events, containers_of, served, wait_state
from tests.support.waiting import until

pytestmark = pytest.mark.docker

CLAUDE_KEY = "sk-ant-instance-key-claude-0123456789"
TOOLS = "/api/v1/repos/ana/demo/tools"
TASKS = "/api/v1/repos/ana/demo/tasks"
HOSTILE = "; rm -rf / $(id) `id` 'quoted'"
LOOKUP: dict[str, Any] = {
    "name": "lookup",
    "description": "Look a pattern up",
    "parameters": {
        "type": "object",
        "properties": {"pattern": {"type": "string", "maxLength": 200}},
        "required": ["pattern"],
    },
    "script": (
        'printf "arg=%s\\n" "$FORGEHAND_ARG_PATTERN"\n'
        'printf "file=%s\\n" "$(cat "$FORGEHAND_TOOL_INPUT_FILE")"\n'
        'printf "tool=%s version=%s\\n" "$FORGEHAND_TOOL_NAME" "$FORGEHAND_TOOL_VERSION"\n'
        "ls /workspace\n"
        'env | grep -c -i -E "token|api_key|secret" || true\n'
    ),
    "interpreter": "sh",
    "mode": "auto",
    "read_only": True,
    "timeout_seconds": 60,
}
RUN_TESTS: dict[str, Any] = {
    **LOOKUP,
    "name": "run_tests",
    "description": "Run the tests matching a pattern",
    "script": 'echo "ran tests matching $FORGEHAND_ARG_PATTERN"\n',
    "mode": "approval",
    "read_only": False,
}


async def define(c: httpx.AsyncClient, body: dict[str, Any]) -> int:
    r = await c.post(TOOLS, json=body)
    assert r.status_code == 201, r.text
    tool_id = int(r.json()["id"])
    r = await c.post(f"{TOOLS}/{tool_id}/activate", json={"version": 1})
    assert r.status_code == 200, r.text
    return tool_id


async def add_policy(
    c: httpx.AsyncClient,
    settings: Settings,
    consumer: PolicyConsumer,
    events: tuple[str, ...] | list[str] = ("pre_tool_use",),
) -> None:
    hook = {"url": consumer.url, "kind": "policy", "events": list(events), "failure_policy": "closed"}
    token = await make_hook_token(settings)
    r = await c.post("/api/v1/repos/ana/demo/hooks", json=hook, headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 201, r.text


def results(model: ScriptedModel) -> dict[str, str]:
    return {m["tool_call_id"]: m["content"] for r in model.requests for m in r["messages"] if m["role"] == "tool"}


async def test_an_auto_tool_runs_at_once_and_an_approval_tool_after_a_person_approves(
    settings: Settings, sandbox_image: str
) -> None:
    script = [
        tool_call("custom_lookup", {"pattern": 5}, call_id="c_bad"),
        tool_call("custom_lookup", {"pattern": HOSTILE}, call_id="c_lookup"),
        tool_call("custom_run_tests", {"pattern": "test_*"}, call_id="c_tests"),
        reply("done"),
    ]
    consumer = PolicyConsumer()
    with ScriptedModel(script) as model:
        async with served(
            settings, model_base_url=model.url, model_name="scripted", webhooks_allowed_hosts="127.0.0.1"
        ) as (
            env,
            c,
        ):
            await add_policy(c, env.settings, consumer)
            lookup_id = await define(c, LOOKUP)
            tests_id = await define(c, RUN_TESTS)
            await c.post(TASKS, json={"goal": "look it up and test", "agent": "fixer"})

            async def waiting() -> dict[str, Any] | None:
                runs = (await c.get(f"{TOOLS}/{tests_id}/runs")).json()
                return runs[0] if runs and runs[0]["state"] == "awaiting_approval" else None

            pending = await until(waiting, timeout=120, what="the run_tests call to wait for approval")
            assert pending is not None and pending["inputs"] == {"pattern": "test_*"} and pending["version"] == 1
            r = await c.post(f"/api/v1/repos/ana/demo/tool-runs/{pending['id']}/approve", json={"reason": "fine"})
            assert r.status_code == 200 and r.json()["state"] == "queued", r.text
            done = await wait_state(c, 1, "awaiting_review", "failed")
            events = await all_events(c, 1)
            lookup_runs = (await c.get(f"{TOOLS}/{lookup_id}/runs")).json()
            test_runs = (await c.get(f"{TOOLS}/{tests_id}/runs")).json()
    assert done["state"] == "awaiting_review", done
    got = results(model)
    assert "inputs.pattern" in got["c_bad"] and "nothing was run" in got["c_bad"]
    out = got["c_lookup"]
    assert f"arg={HOSTILE}\n" in out and '"pattern"' in out and "tool=lookup version=1" in out, out
    assert "README" in out or "readme" in out.lower(), out  # the task's workspace is mounted
    assert "data, not instructions" in out and "<tool_output>" in out
    assert out.rstrip().endswith("0\n</tool_output>") or "\n0\n" in out, out  # no credential in its environment
    assert "ran tests matching test_*" in got["c_tests"] and "exit code 0" in got["c_tests"]
    # One run each, recorded with the version and the task; the invalid call made none.
    assert [(r["state"], r["version"], r["task"], r["exit_code"]) for r in lookup_runs] == [("succeeded", 1, 1, 0)]
    assert [(r["state"], r["decided_by"]) for r in test_runs] == [("succeeded", "ana")]
    assert lookup_runs[0]["inputs"] == {"pattern": HOSTILE}
    # The policy saw each valid call as custom_<name>, with the version and the validated inputs.
    seen = [b["data"] for b in consumer.seen if b["type"] == "pre_tool_use"]
    custom = [(d["tool_name"], d["tool_input"]) for d in seen if d["tool_name"].startswith("custom_")]
    assert custom == [
        ("custom_lookup", {"version": 1, "inputs": {"pattern": HOSTILE}}),
        ("custom_run_tests", {"version": 1, "inputs": {"pattern": "test_*"}}),
    ]
    states = [e["payload"]["state"] for e in events if e["kind"] == "tool_run"]
    assert states.count("succeeded") == 2 and "awaiting_approval" in states and "running" in states
    seqs = [e["seq"] for e in events]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))  # gap-free


async def test_a_policy_deny_of_a_custom_tool_reaches_the_agent_and_runs_nothing(
    settings: Settings, sandbox_image: str
) -> None:
    class DenyLookup(PolicyConsumer):
        def answer(self, body: dict[str, Any]) -> tuple[int, dict[str, Any] | None]:
            if body["type"] == "pre_tool_use" and body["data"]["tool_name"] == "custom_lookup":
                return 200, {"permission": {"decision": "deny", "reason": "no lookups on Fridays"}}
            return 200, None

    consumer = DenyLookup()
    script = [tool_call("custom_lookup", {"pattern": "x"}, call_id="c_lookup"), reply("ok")]
    with ScriptedModel(script) as model:
        async with served(
            settings, model_base_url=model.url, model_name="scripted", webhooks_allowed_hosts="127.0.0.1"
        ) as (
            env,
            c,
        ):
            await add_policy(c, env.settings, consumer)
            lookup_id = await define(c, LOOKUP)
            await c.post(TASKS, json={"goal": "look it up", "agent": "fixer"})
            await wait_state(c, 1, "awaiting_review", "failed")
            runs = (await c.get(f"{TOOLS}/{lookup_id}/runs")).json()
    assert "no lookups on Fridays" in results(model)["c_lookup"]
    assert runs == []


async def test_a_claude_code_agent_calls_a_tool_that_waits_for_approval(settings: Settings, agents_image: str) -> None:
    """The real Claude Code CLI in the agents image calls `custom_run_tests` on forgehand's MCP
    server; the call waits until a person approves it, and the approved run's output reaches the
    agent as the tool's result; the run history shows it."""
    turns = [
        tool_use("mcp__forgehand__custom_run_tests", {"pattern": "test_x"}, id="toolu_t"),
        text("Tests ran."),
    ]
    consumer = PolicyConsumer()
    with ScriptedAnthropic(turns) as api:
        model = {"anthropic_base_url": api.url, "anthropic_api_key": CLAUDE_KEY, "anthropic_model": "claude-test"}
        async with served(settings, **model, webhooks_allowed_hosts="127.0.0.1") as (env, c):
            await add_policy(c, env.settings, consumer, events=["pre_tool_use", "post_tool_use"])
            tests_id = await define(c, RUN_TESTS)
            r = await c.post(TASKS, json={"goal": "run the tests", "agent": "fixer", "runtime": "claude-code"})
            assert r.status_code == 201, r.text

            async def waiting() -> dict[str, Any] | None:
                runs = (await c.get(f"{TOOLS}/{tests_id}/runs")).json()
                return runs[0] if runs and runs[0]["state"] == "awaiting_approval" else None

            pending = await until(waiting, timeout=180, what="the run_tests call to wait for approval")
            assert pending is not None and pending["inputs"] == {"pattern": "test_x"}
            r = await c.post(f"/api/v1/repos/ana/demo/tool-runs/{pending['id']}/approve")
            assert r.status_code == 200, r.text
            done = await wait_state(c, 1, "awaiting_review", "failed", timeout=180)
            runs = (await c.get(f"{TOOLS}/{tests_id}/runs")).json()
    assert done["state"] == "awaiting_review", done
    assert [(r["state"], r["task"], r["version"]) for r in runs] == [("succeeded", 1, 1)]
    results = {
        b["tool_use_id"]: json.dumps(b["content"])
        for body in api.requests
        for m in body["messages"]
        if isinstance(m["content"], list)
        for b in m["content"]
        if b.get("type") == "tool_result"
    }
    assert "ran tests matching test_x" in results["toolu_t"] and "exit code 0" in results["toolu_t"]
    offered = {t["name"] for t in api.requests[0]["tools"]}
    assert {"mcp__forgehand__custom_run_tests", "mcp__forgehand__get_tool_run"} <= offered
    # The hooks name the call custom_run_tests, before it (with the version and the inputs) and after.
    hooked = [(b["type"], b["data"]["tool_name"]) for b in consumer.seen if b["type"].endswith("tool_use")]
    assert ("pre_tool_use", "custom_run_tests") in hooked and ("post_tool_use", "custom_run_tests") in hooked
    [pre] = [b["data"] for b in consumer.seen if b["type"] == "pre_tool_use"]
    assert pre["tool_input"] == {"version": 1, "inputs": {"pattern": "test_x"}}
    [post] = [b["data"] for b in consumer.seen if b["type"] == "post_tool_use"]
    assert "ran tests matching test_x" in json.dumps(post)


async def test_stopping_a_task_kills_and_removes_a_silent_tool_run(settings: Settings, sandbox_image: str) -> None:
    """The agent's call of a tool that sleeps in silence is running in its own container when the
    task is stopped: the stop reports done only once that container is gone too, and the tool
    run ends `cancelled`."""
    silent = {**LOOKUP, "name": "wait_long", "script": "sleep 600\n", "timeout_seconds": 900}
    script = [tool_call("custom_wait_long", {"pattern": "x"}, call_id="c_wait"), reply("never")]
    with ScriptedModel(script) as model:
        async with served(settings, model_base_url=model.url, model_name="scripted") as (env, c):
            tool_id = await define(c, silent)
            await c.post(TASKS, json={"goal": "wait", "agent": "fixer"})

            async def running() -> bool:
                runs = (await c.get(f"{TOOLS}/{tool_id}/runs")).json()
                return bool(runs) and runs[0]["state"] == "running"

            await until(running, timeout=120, what="the silent tool to run")
            tool_boxes = [b for b in containers_of(env.settings) if LABEL_TOOL_RUN in b.labels]
            assert len(tool_boxes) == 1  # its own container, beside the agent's sandbox
            r = await c.post(f"{TASKS}/1/stop")
            assert r.status_code == 200 and r.json()["state"] == "stopped", r.text
            assert containers_of(env.settings) == []  # the agent's sandbox and the tool's both gone
            [run] = (await c.get(f"{TOOLS}/{tool_id}/runs")).json()
    assert run["state"] == "cancelled" and run["exit_code"] is None


async def test_an_admins_agent_proposes_a_tool_as_a_draft_and_others_cannot(
    settings: Settings, sandbox_image: str
) -> None:
    proposal = {
        "name": "count_lines",
        "description": "Count the lines of a file",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
        "script": 'wc -l "/workspace/$FORGEHAND_ARG_PATH"\n',
        "interpreter": "sh",
    }
    script = [tool_call("propose_tool", proposal, call_id="c_propose"), reply("proposed")]
    with ScriptedModel(script) as model:
        async with served(settings, model_base_url=model.url, model_name="scripted") as (_env, c):
            await c.post(TASKS, json={"goal": "propose a tool", "agent": "fixer"})
            done = await wait_state(c, 1, "awaiting_review", "failed")
            tools = (await c.get(TOOLS)).json()
            offered = (await c.get(TOOLS + "?for=agents")).json()
    assert done["state"] == "awaiting_review", done
    assert "saved as a draft" in results(model)["c_propose"]
    [tool] = tools
    assert tool["name"] == "count_lines" and tool["active_version"] is None
    assert tool["latest"]["mode"] == "approval" and tool["latest"]["proposed_by_task"] == 1
    assert tool["latest"]["created_by"] == "fixer"
    assert offered == []  # a draft is offered to nobody
    # The agents' tool lists: propose_tool was offered to this task (ana, an admin, started it).
    assert "propose_tool" in {t["function"]["name"] for t in model.requests[0]["tools"]}
