"""Policy hooks wired into the task life (hooks-protocol.md): a real consumer on 127.0.0.1 allows
or denies the goal and each tool call of the builtin runtime, and forgehand obeys."""

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import msgspec
import pytest

from forge import accounts, tokens
from forge.audit import Actor
from forge.db import Database
from forge.settings import Settings
from tests.docker.test_tasks_run import Env, all_events, seed, serve, task_settings, tree_files, wait_state
from tests.helpers_model import ScriptedModel, reply, tool_call

pytestmark = pytest.mark.docker


class PolicyConsumer:
    """Answers each policy event with a scripted JSON body (or status)."""

    def __init__(self, answers: dict[str, tuple[int, dict[str, Any] | None]]) -> None:
        self.answers = answers
        self.seen: list[dict[str, Any]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", "0"))))
                outer.seen.append(body)
                status, answer = outer.answers.get(body["type"], (200, None))
                data = json.dumps(answer).encode() if answer is not None else b""
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/policy"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def types(self) -> list[str]:
        return [b["type"] for b in self.seen]


@pytest.fixture
def policy_settings(settings: Settings, sandbox_image: str) -> Settings:
    return msgspec.structs.replace(task_settings(settings), webhooks_allowed_hosts="127.0.0.1")


async def _hook_token(settings: Settings) -> str:
    db = Database(settings.effective_database_url)
    try:
        async with db.session(write=True) as s:
            ana = await accounts.require_by_login(s, "ana")
            return (await tokens.create(s, Actor.system("test"), ana, "hooks", ["webhooks:admin"], None)).token
    finally:
        await db.dispose()


def _served(settings: Settings, consumer: PolicyConsumer, events: list[str], failure: str = "closed") -> Iterator[Env]:
    token, path = asyncio.run(seed(settings))
    hook_token = asyncio.run(_hook_token(settings))
    for url in serve(settings):
        import httpx

        r = httpx.post(
            f"{url}/api/v1/repos/ana/demo/hooks",
            json={"url": consumer.url, "kind": "policy", "events": events, "failure_policy": failure},
            headers={"Authorization": f"Bearer {hook_token}"},
            timeout=30,
        )
        assert r.status_code == 201, r.text
        yield Env(url=url, settings=settings, token=token, repo_path=path)


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

    for env in _served(policy_settings, consumer, ["user_prompt_submit"]):
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

    for env in _served(policy_settings, consumer, ["user_prompt_submit"]):
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

        for env in _served(settings, consumer, ["pre_tool_use"]):
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
