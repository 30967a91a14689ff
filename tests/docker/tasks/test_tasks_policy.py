"""Policy hooks wired into the task life (docs/webhooks.md): a real consumer on 127.0.0.1 allows
or denies the goal and each tool call of the builtin runtime, and forgehand obeys."""

import asyncio
import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from forge.core.settings import Settings
from tests.support.model import ScriptedModel, reply, tool_call
from tests.support.policy import PolicyConsumer, decisions, make_hook_token, reference_consumer, served_with_policy
from tests.support.tasks import Env, all_events, seed, serve, task_settings, tree_files, wait_state

pytestmark = pytest.mark.docker


@pytest.fixture
def policy_settings(settings: Settings, sandbox_image: str) -> Settings:
    return msgspec.structs.replace(task_settings(settings), webhooks_allowed_hosts="127.0.0.1")


def test_denied_goal_is_refused_and_nothing_is_stored(policy_settings: Settings) -> None:
    consumer = PolicyConsumer(
        {"user_prompt_submit": (200, {"permission": {"decision": "deny", "reason": "no"}, "user_message": "not here"})}
    )

    async def check(env: Env) -> None:
        async with env.client() as c:
            r = await c.post(
                "/api/v1/repos/ana/demo/tasks",
                json={"goal": "rm -rf", "agent": "fixer", "runtime": "command", "command": "true"},
            )
            assert r.status_code == 403 and r.json()["code"] == "policy_denied", r.text
            assert "not here" in r.json()["detail"]
            assert (await c.get("/api/v1/repos/ana/demo/tasks")).json() == []

    for env in served_with_policy(policy_settings, consumer, ["user_prompt_submit"]):
        asyncio.run(check(env))
    assert consumer.types() == ["user_prompt_submit"]
    assert consumer.seen[0]["data"]["prompt"] == "rm -rf"


def test_failing_consumer_fails_closed_with_502(policy_settings: Settings) -> None:
    consumer = PolicyConsumer({"user_prompt_submit": (500, None)})

    async def check(env: Env) -> None:
        async with env.client() as c:
            r = await c.post(
                "/api/v1/repos/ana/demo/tasks",
                json={"goal": "x", "agent": "fixer", "runtime": "command", "command": "true"},
            )
            assert r.status_code == 502 and r.json()["code"] == "hook_dispatch_failed", r.text
            assert "hook dispatch failed: user_prompt_submit: http_error (delivery " in r.json()["detail"]

    for env in served_with_policy(policy_settings, consumer, ["user_prompt_submit"]):
        asyncio.run(check(env))


def test_denied_tool_call_is_not_run_and_the_model_is_told(policy_settings: Settings, tmp_path: Path) -> None:
    consumer = PolicyConsumer(
        {
            "pre_tool_use": (
                200,
                {"permission": {"decision": "deny", "reason": "writes are reviewed"}, "model_context": "SECRET-CTX"},
            )
        }
    )
    turns = [tool_call("write_file", {"path": "evil.txt", "content": "x"}), reply("ok, I stop")]
    with ScriptedModel(turns) as model:
        settings = msgspec.structs.replace(policy_settings, model_base_url=model.url, model_name="scripted")

        async def check(env: Env) -> tuple[dict[str, Any], list[dict[str, Any]]]:
            async with env.client() as c:
                r = await c.post("/api/v1/repos/ana/demo/tasks", json={"goal": "write", "agent": "fixer"})
                assert r.status_code == 201, r.text
                done = await wait_state(c, 1, "failed", "stopped", "awaiting_review", "blocked", timeout=90)
                return done, await all_events(c, 1)

        for env in served_with_policy(settings, consumer, ["pre_tool_use"]):
            done, events = asyncio.run(check(env))
            assert "evil.txt" not in tree_files(env.repo_path, done["head_sha"])
        # The model saw the synthetic result, with the reason quoted and never the consumer's context.
        tool_results = [m for m in model.requests[1]["messages"] if m["role"] == "tool"]
        assert "external policy blocked" in tool_results[0]["content"]
        assert "writes are reviewed" in tool_results[0]["content"]
        assert "SECRET-CTX" not in tool_results[0]["content"]
        # ...it reaches the model as a separate note after the tool results
        notes = [m for m in model.requests[1]["messages"] if m["role"] == "system" and "SECRET-CTX" in m["content"]]
        assert len(notes) == 1
    assert done["state"] == "awaiting_review"
    results = [e for e in events if e["kind"] == "tool_result"]
    assert results and results[0]["payload"]["is_error"] is True
    assert consumer.types() == ["pre_tool_use"]
    assert consumer.seen[0]["data"]["tool_name"] == "write_file"
    # the decision is in the transcript, with the endpoint, its result class and latency
    [record] = [e for e in events if e["kind"] == "system" and e["payload"].get("phase") == "policy"]
    assert record["payload"]["text"].startswith("pre_tool_use: deny (")
    endpoint = record["payload"]["detail"]["endpoints"][0]
    assert endpoint["url"] == consumer.url and endpoint["result"] == "denied" and endpoint["latency_ms"] >= 0


class ByInputConsumer(PolicyConsumer):
    """Denies a pre_tool_use whose input mentions `evil`; asks the agent to go on once at `stop`."""

    def answer(self, body: dict[str, Any]) -> tuple[int, dict[str, Any] | None]:
        if body["type"] == "pre_tool_use" and "evil" in json.dumps(body["data"]["tool_input"]):
            return 200, {"permission": {"decision": "deny", "reason": "no evil"}}
        if body["type"] == "stop":
            return 200, {"model_context": "one more thing: add done.txt"}
        return 200, None


def _run_builtin(settings: Settings, consumer: PolicyConsumer, turns: list[Any], events: list[str]) -> Any:
    with ScriptedModel(turns) as model:
        s = msgspec.structs.replace(settings, model_base_url=model.url, model_name="scripted")

        async def check(env: Env) -> tuple[dict[str, Any], list[dict[str, Any]]]:
            async with env.client() as c:
                r = await c.post("/api/v1/repos/ana/demo/tasks", json={"goal": "go", "agent": "fixer"})
                assert r.status_code == 201, r.text
                done = await wait_state(c, 1, "failed", "stopped", "awaiting_review", "blocked", timeout=90)
                return done, await all_events(c, 1)

        for env in served_with_policy(s, consumer, events):
            done, transcript = asyncio.run(check(env))
            files = tree_files(env.repo_path, done["head_sha"])
        return done, transcript, files, model.requests


def test_mixed_batch_runs_only_the_allowed_calls_in_order(policy_settings: Settings) -> None:
    from tests.support.model import tool_calls

    turns = [
        tool_calls(
            [
                ("write_file", {"path": "a.txt", "content": "a"}, "c1"),
                ("write_file", {"path": "evil.txt", "content": "x"}, "c2"),
                ("write_file", {"path": "b.txt", "content": "b"}, "c3"),
            ]
        ),
        reply("done"),
    ]
    done, transcript, files, requests = _run_builtin(policy_settings, ByInputConsumer(), turns, ["pre_tool_use"])
    assert done["state"] == "awaiting_review", (done, transcript[-3:])
    assert "a.txt" in files and "b.txt" in files and "evil.txt" not in files
    results = [(e["payload"]["id"], e["payload"]["is_error"]) for e in transcript if e["kind"] == "tool_result"]
    assert results == [("c1", False), ("c2", True), ("c3", False)]
    tool_msgs = [m["tool_call_id"] for m in requests[1]["messages"] if m["role"] == "tool"]
    assert tool_msgs == ["c1", "c2", "c3"]


def test_duplicate_tool_use_id_in_one_turn_fails_closed(policy_settings: Settings) -> None:
    from tests.support.model import tool_calls

    turns = [
        tool_calls(
            [
                ("write_file", {"path": "x.txt", "content": "x"}, "dup"),
                ("write_file", {"path": "y.txt", "content": "y"}, "dup"),
            ]
        ),
        reply("done"),
    ]
    consumer = ByInputConsumer()
    done, transcript, files, _ = _run_builtin(policy_settings, consumer, turns, ["pre_tool_use"])
    assert done["state"] == "awaiting_review", done
    assert "x.txt" not in files and "y.txt" not in files
    errors = [e for e in transcript if e["kind"] == "tool_result" and e["payload"]["is_error"]]
    assert len(errors) == 2 and all("used twice" in e["payload"]["output"] for e in errors)
    assert "pre_tool_use" not in consumer.types()  # nothing was even asked about


def test_stop_context_continues_the_agent_exactly_once(policy_settings: Settings) -> None:
    turns = [reply("finished"), tool_call("write_file", {"path": "done.txt", "content": "ok"}), reply("now done")]
    done, _, files, requests = _run_builtin(policy_settings, ByInputConsumer(), turns, ["stop"])
    assert done["state"] == "awaiting_review", done
    assert "done.txt" in files
    # finished -> (stop: continue) -> write -> now done -> (stop again: not continued a second time)
    assert len(requests) == 3
    assert any(m.get("content") == "one more thing: add done.txt" for m in requests[1]["messages"])


def test_reference_consumer_denies_bash_in_a_real_task(policy_settings: Settings) -> None:
    """The issue's walkthrough: `forgehand hooks serve --deny-tool-pattern bash` as a real process
    watching a builtin task; the bash call is denied and the synthetic result is in the transcript."""
    turns = [tool_call("bash", {"command": "echo pwned > pwned.txt"}, call_id="b1"), reply("I could not run it")]
    with ScriptedModel(turns) as model:
        settings = msgspec.structs.replace(policy_settings, model_base_url=model.url, model_name="scripted")
        token, path = asyncio.run(seed(settings))
        hook_token = asyncio.run(make_hook_token(settings))
        for url in serve(settings):
            with reference_consumer(url, hook_token, "bash") as proc:
                env = Env(url=url, settings=settings, token=token, repo_path=path)

                async def check(env: Env) -> tuple[dict[str, Any], list[dict[str, Any]]]:
                    async with env.client() as c:
                        r = await c.post("/api/v1/repos/ana/demo/tasks", json={"goal": "shell", "agent": "fixer"})
                        assert r.status_code == 201, r.text
                        done = await wait_state(c, 1, "awaiting_review", "failed", "blocked", timeout=90)
                        return done, await all_events(c, 1)

                done, events = asyncio.run(check(env))
            files = tree_files(path, done["head_sha"])
    assert done["state"] == "awaiting_review", done
    assert "pwned.txt" not in files
    [result] = [e["payload"] for e in events if e["kind"] == "tool_result"]
    assert result["id"] == "b1" and result["is_error"] is True
    assert result["output"].startswith("error: an external policy blocked this bash call; it was not executed")
    assert [x.get("decision") for x in decisions(proc) if x.get("event") == "pre_tool_use"] == ["deny"]


def test_reference_consumer_asks_and_a_person_approves(policy_settings: Settings) -> None:
    """`forgehand hooks serve --ask-tool-pattern '^bash: echo asked'` as a real process: the matching
    call waits for a person, runs once approved; the other call is not asked about."""
    turns = [
        tool_call("bash", {"command": "echo asked > asked.txt"}, call_id="a1"),
        tool_call("bash", {"command": "echo free > free.txt"}, call_id="a2"),
        reply("both written"),
    ]
    with ScriptedModel(turns) as model:
        settings = msgspec.structs.replace(policy_settings, model_base_url=model.url, model_name="scripted")
        token, path = asyncio.run(seed(settings))
        hook_token = asyncio.run(make_hook_token(settings))
        for url in serve(settings):
            with reference_consumer(url, hook_token, ask_tool_pattern="^bash: echo asked") as proc:
                env = Env(url=url, settings=settings, token=token, repo_path=path)

                async def check(env: Env) -> tuple[dict[str, Any], dict[str, Any]]:
                    async with env.client() as c:
                        r = await c.post("/api/v1/repos/ana/demo/tasks", json={"goal": "shell", "agent": "fixer"})
                        assert r.status_code == 201, r.text
                        blocked = await wait_state(c, 1, "blocked", "failed", "awaiting_review", timeout=90)
                        parked = blocked["pending_approval"]
                        assert blocked["state"] == "blocked" and parked is not None, blocked
                        r = await c.post(
                            f"/api/v1/repos/ana/demo/tasks/1/approvals/{parked['id']}",
                            json={"decision": "approve", "input_hash": parked["input_hash"]},
                        )
                        assert r.status_code == 200, r.text
                        return parked, await wait_state(c, 1, "awaiting_review", "failed", "blocked", timeout=90)

                parked, done = asyncio.run(check(env))
            files = tree_files(path, done["head_sha"])
    assert parked["tool_use_id"] == "a1" and parked["tool_input"] == {"command": "echo asked > asked.txt"}
    assert (
        parked["reason"]
        == "'bash: echo asked > asked.txt' matches the ask pattern '^bash: echo asked': a person decides"
    )
    assert done["state"] == "awaiting_review", done
    assert files["asked.txt"][1] == b"asked\n" and files["free.txt"][1] == b"free\n"
    logged = [x.get("decision") for x in decisions(proc) if x.get("event") == "pre_tool_use"]
    assert logged == ["ask", None]  # the approved call is not asked about again
