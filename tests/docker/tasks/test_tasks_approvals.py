"""Approvals (docs/webhooks.md, `pre_tool_use` ask and failure policy `hold`): the call is parked,
a collaborator with write access approves or denies it, approving runs exactly the parked input,
and stop or expiry end it. Real Docker, a real policy consumer and a scripted model."""

import asyncio
import json
from typing import Any

import httpx
import msgspec
import pytest
from sqlalchemy import select

from forge.accounts import accounts, tokens
from forge.core.settings import Settings
from forge.db.audit import Actor
from forge.db.engine import Database
from forge.db.models import AuditEvent
from forge.git import RepoStore
from forge.repos import collaborators, repositories
from tests.support.model import ScriptedModel, reply, tool_call
from tests.support.policy import PolicyConsumer, served_with_policy
from tests.support.tasks import Env, all_events, tree_files, wait_state

pytestmark = pytest.mark.docker

ASK = (200, {"permission": {"decision": "ask", "reason": "shell commands need a person"}})
SYSTEM = Actor.system("test")


async def _reader_token(settings: Settings) -> str:
    """rita: a read-only collaborator of ana/demo, with a tasks:write token."""
    db = Database(settings.effective_database_url)
    store = RepoStore(settings.data_dir / "repos")
    try:
        async with db.session(write=True) as s:
            rita = await accounts.create_user(s, SYSTEM, "rita", "correct horse battery")
            repo = await repositories.load(s, SYSTEM.principal, "ana", "demo")
            await collaborators.set_collaborator(s, SYSTEM, repo, "rita", "read")
            return (await tokens.create(s, SYSTEM, rita, "t", ["repo:read", "tasks:write"], None)).token
    finally:
        await store.close()
        await db.dispose()


async def _audit_actions(settings: Settings) -> list[tuple[str, str]]:
    db = Database(settings.effective_database_url)
    try:
        async with db.session() as s:
            rows = (await s.execute(select(AuditEvent).where(AuditEvent.action == "task.approval"))).scalars().all()
            return [(r.action, r.result) for r in rows]
    finally:
        await db.dispose()


@pytest.fixture
def policy_settings(settings: Settings, sandbox_image: str) -> Settings:
    from tests.support.tasks import task_settings

    return msgspec.structs.replace(task_settings(settings), webhooks_allowed_hosts="127.0.0.1")


async def _blocked(c: httpx.AsyncClient, number: int) -> dict[str, Any]:
    task = await wait_state(c, number, "blocked", "failed", "awaiting_review", timeout=90)
    assert task["state"] == "blocked", task
    return task


def test_approve_runs_exactly_the_parked_input_once(policy_settings: Settings) -> None:
    consumer = PolicyConsumer({"pre_tool_use": ASK})
    command = {"command": "echo '<ok> & done' > approved.txt"}
    turns = [tool_call("bash", command, call_id="c1"), reply("all done")]
    with ScriptedModel(turns) as model:
        settings = msgspec.structs.replace(policy_settings, model_base_url=model.url, model_name="scripted")

        async def check(env: Env) -> tuple[dict[str, Any], list[dict[str, Any]]]:
            reader = await _reader_token(env.settings)
            async with env.client() as c:
                r = await c.post("/api/v1/repos/ana/demo/tasks", json={"goal": "shell", "agent": "fixer"})
                assert r.status_code == 201, r.text
                task = await _blocked(c, 1)
                parked = task["pending_approval"]
                assert parked["state"] == "pending" and parked["tool_name"] == "bash"
                assert parked["tool_input"] == command and parked["tool_use_id"] == "c1"
                assert parked["reason"] == "shell commands need a person" and parked["requested_by"] == consumer.url
                assert parked["held"] is False
                listed = (await c.get("/api/v1/repos/ana/demo/tasks/1/approvals")).json()
                assert [a["id"] for a in listed] == [parked["id"]]
                url = f"/api/v1/repos/ana/demo/tasks/1/approvals/{parked['id']}"
                # Nothing else moves the task on while a call waits: no message, no answer.
                r = await c.post("/api/v1/repos/ana/demo/tasks/1/messages", json={"body": "go on"})
                assert r.status_code == 409 and r.json()["code"] == "approval_pending", r.text
                r = await c.post("/api/v1/repos/ana/demo/tasks/1/answer", json={"body": "yes"})
                assert r.status_code == 409 and r.json()["code"] == "no_pending_question", r.text
                # A read-only collaborator does not even see tasks.
                r = await c.post(url, json={"decision": "approve"}, headers={"Authorization": f"Bearer {reader}"})
                assert r.status_code == 404, r.text
                # Bound to the input the person saw.
                r = await c.post(url, json={"decision": "approve", "input_hash": "0" * 64})
                assert r.status_code == 409 and r.json()["code"] == "approval_input_mismatch", r.text
                r = await c.post(url, json={"decision": "maybe"})
                assert r.status_code == 422 and r.json()["code"] == "validation_failed", r.text
                r = await c.post(url, json={"decision": "approve", "input_hash": parked["input_hash"]})
                assert r.status_code == 200, r.text
                assert r.json()["state"] == "approved" and r.json()["decided_by"] == "ana"
                r = await c.post(url, json={"decision": "deny"})
                assert r.status_code == 409 and r.json()["code"] == "approval_not_pending", r.text
                done = await wait_state(c, 1, "awaiting_review", "failed", "blocked", timeout=90)
                return done, await all_events(c, 1)

        for env in served_with_policy(settings, consumer, ["pre_tool_use"]):
            done, events = asyncio.run(check(env))
            files = tree_files(env.repo_path, done["head_sha"])
            audit = asyncio.run(_audit_actions(env.settings))
    assert done["state"] == "awaiting_review", done
    assert files["approved.txt"][1] == b"<ok> & done\n"
    assert [r["kind"] for r in done["runs"]] == ["start", "approval"]
    assert done["pending_approval"] is None
    # The approved call was not sent to the consumer a second time.
    assert consumer.types() == ["pre_tool_use"]
    # The model got the call's real result in the resumed conversation.
    [result] = [m for m in model.requests[1]["messages"] if m["role"] == "tool"]
    assert result["tool_call_id"] == "c1" and result["content"].startswith("exit code 0")
    texts = [e["payload"].get("text", "") for e in events if e["kind"] == "notice"]
    assert any("waits for approval" in t for t in texts) and any("ana approved the bash call" in t for t in texts)
    assert audit == [("task.approval", "ok")]


@pytest.mark.both_databases  # recovery / one writer wins: each database's own locking
def test_concurrent_decisions_one_wins_and_a_denial_reaches_the_model(policy_settings: Settings) -> None:
    consumer = PolicyConsumer({"pre_tool_use": ASK})
    turns = [tool_call("write_file", {"path": "no.txt", "content": "x"}, call_id="w1"), reply("understood")]
    with ScriptedModel(turns) as model:
        settings = msgspec.structs.replace(policy_settings, model_base_url=model.url, model_name="scripted")

        async def check(env: Env) -> dict[str, Any]:
            async with env.client() as c:
                r = await c.post("/api/v1/repos/ana/demo/tasks", json={"goal": "write", "agent": "fixer"})
                assert r.status_code == 201, r.text
                parked = (await _blocked(c, 1))["pending_approval"]
                url = f"/api/v1/repos/ana/demo/tasks/1/approvals/{parked['id']}"
                answers = await asyncio.gather(
                    *(c.post(url, json={"decision": "deny", "reason": f"not now {i}"}) for i in range(4))
                )
                codes = sorted(a.status_code for a in answers)
                assert codes == [200, 409, 409, 409], [a.text for a in answers]
                assert all(a.json()["code"] == "approval_not_pending" for a in answers if a.status_code == 409)
                done = await wait_state(c, 1, "awaiting_review", "failed", timeout=90)
                assert len(done["runs"]) == 2  # one decision, one resumed run
                return done

        for env in served_with_policy(settings, consumer, ["pre_tool_use"]):
            done = asyncio.run(check(env))
            files = tree_files(env.repo_path, done["head_sha"])
    assert done["state"] == "awaiting_review", done
    assert "no.txt" not in files
    [result] = [m for m in model.requests[1]["messages"] if m["role"] == "tool"]
    assert "a person denied this write_file call" in result["content"] and "not now" in result["content"]


def test_hold_parks_the_call_then_stop_cancels_and_time_expires(policy_settings: Settings) -> None:
    consumer = PolicyConsumer({"pre_tool_use": (500, None)})  # fails: failure policy `hold` parks the call
    turns = [
        tool_call("bash", {"command": "touch one"}, call_id="a1"),
        tool_call("bash", {"command": "touch two"}, call_id="b1"),
    ]
    with ScriptedModel(turns) as model:
        settings = msgspec.structs.replace(
            policy_settings, model_base_url=model.url, model_name="scripted", task_approval_ttl_seconds=6
        )

        async def check(env: Env) -> None:
            async with env.client() as c:
                r = await c.post("/api/v1/repos/ana/demo/tasks", json={"goal": "one", "agent": "fixer"})
                assert r.status_code == 201, r.text
                parked = (await _blocked(c, 1))["pending_approval"]
                assert parked["held"] is True
                assert parked["reason"].startswith("hook dispatch failed: pre_tool_use: http_error (delivery ")
                r = await c.post("/api/v1/repos/ana/demo/tasks/1/stop")
                assert r.status_code == 200 and r.json()["state"] == "stopped", r.text
                [cancelled] = (await c.get("/api/v1/repos/ana/demo/tasks/1/approvals")).json()
                assert cancelled["state"] == "cancelled"
                r = await c.post(
                    f"/api/v1/repos/ana/demo/tasks/1/approvals/{parked['id']}", json={"decision": "approve"}
                )
                assert r.status_code == 409 and r.json()["code"] == "approval_not_pending", r.text

                r = await c.post("/api/v1/repos/ana/demo/tasks", json={"goal": "two", "agent": "fixer"})
                assert r.status_code == 201, r.text
                parked = (await _blocked(c, 2))["pending_approval"]
                failed = await wait_state(c, 2, "failed", timeout=60)
                assert failed["failure_reason"] == "approval_expired" and "expired" in failed["error"]
                [expired] = (await c.get("/api/v1/repos/ana/demo/tasks/2/approvals")).json()
                assert expired["state"] == "expired"
                r = await c.post(
                    f"/api/v1/repos/ana/demo/tasks/2/approvals/{parked['id']}", json={"decision": "approve"}
                )
                assert r.status_code == 409, r.text

        for env in served_with_policy(settings, consumer, ["pre_tool_use"], failure="hold"):
            asyncio.run(check(env))
    assert consumer.types().count("pre_tool_use") >= 2
    assert len(model.requests) == 2  # neither task went past its parked call


class AskAndGuardPrompts(PolicyConsumer):
    """Asks a person about every tool call; denies prompts that mention `forbidden`."""

    def __init__(self) -> None:
        super().__init__({})
        outer = self

        def do_post(h: Any) -> None:
            body = json.loads(h.rfile.read(int(h.headers.get("content-length", "0"))))
            outer.seen.append(body)
            answer = None
            if body["type"] == "pre_tool_use":
                answer = {"permission": {"decision": "ask", "reason": "check it"}}
            elif "forbidden" in body["data"].get("prompt", ""):
                answer = {"permission": {"decision": "deny", "reason": "no"}, "user_message": "not that reason"}
            raw = json.dumps(answer).encode() if answer is not None else b""
            h.send_response(200)
            h.send_header("content-type", "application/json")
            h.send_header("content-length", str(len(raw)))
            h.end_headers()
            h.wfile.write(raw)

        self.server.RequestHandlerClass.do_POST = do_post  # type: ignore[attr-defined]


async def _bot_token(settings: Settings) -> str:
    db = Database(settings.effective_database_url)
    try:
        async with db.session(write=True) as s:
            fixer = await accounts.require_by_login(s, "fixer")
            return (await tokens.create(s, SYSTEM, fixer, "t", ["tasks:write", "reviews:write"], None)).token
    finally:
        await db.dispose()


def test_the_approved_input_is_the_rewritten_one_and_a_denial_reason_is_a_prompt(policy_settings: Settings) -> None:
    from tests.support.model import tool_calls
    from tests.support.tasks import seed, serve

    rewrite = PolicyConsumer(
        {
            "pre_tool_use": (
                200,
                {"permission": {"decision": "allow", "input_override": {"command": "echo SAFE > safe.txt"}}},
            )
        }
    )
    asker = AskAndGuardPrompts()
    turns = [
        tool_calls(
            [
                ("bash", '{"command": NaN}', "n1"),  # not JSON: refused before any policy
                ("bash", {"command": "true"}, "x" * 300),  # an id nothing could store: refused
                ("bash", {"command": "echo RAW > raw.txt"}, "b1"),
            ]
        ),
        reply("done"),
    ]
    with ScriptedModel(turns) as model:
        settings = msgspec.structs.replace(policy_settings, model_base_url=model.url, model_name="scripted")
        token, path = asyncio.run(seed(settings))
        from tests.support.policy import make_hook_token

        hook_token = asyncio.run(make_hook_token(settings))
        bot = asyncio.run(_bot_token(settings))
        for url in serve(settings):
            for consumer, events in ((rewrite, ["pre_tool_use"]), (asker, ["pre_tool_use", "user_prompt_submit"])):
                r = httpx.post(
                    f"{url}/api/v1/repos/ana/demo/hooks",
                    json={"url": consumer.url, "kind": "policy", "events": events},
                    headers={"Authorization": f"Bearer {hook_token}"},
                    timeout=30,
                )
                assert r.status_code == 201, r.text

            async def check(env: Env) -> dict[str, Any]:
                async with env.client() as c:
                    r = await c.post("/api/v1/repos/ana/demo/tasks", json={"goal": "shell", "agent": "fixer"})
                    assert r.status_code == 201, r.text
                    parked = (await _blocked(c, 1))["pending_approval"]
                    # The person sees (and approves) what would run: the first endpoint's rewrite.
                    assert parked["tool_use_id"] == "b1" and parked["tool_input"] == {"command": "echo SAFE > safe.txt"}
                    url = f"/api/v1/repos/ana/demo/tasks/1/approvals/{parked['id']}"
                    r = await c.post(url, json={"decision": "deny", "reason": "a forbidden reason"})
                    assert r.status_code == 403 and r.json()["code"] == "policy_denied", r.text
                    r = await c.post(url, json={"decision": "deny", "reason": "a\x00b"})
                    assert r.status_code == 422, r.text
                    r = await c.post(url, json={"decision": "approve"}, headers={"Authorization": f"Bearer {bot}"})
                    assert r.status_code == 403 and r.json()["code"] == "agent_cannot_decide", r.text
                    assert (await c.get(url.rsplit("/", 1)[0])).json()[0]["state"] == "pending"
                    r = await c.post(url, json={"decision": "approve", "input_hash": parked["input_hash"]})
                    assert r.status_code == 200, r.text
                    return await wait_state(c, 1, "awaiting_review", "failed", timeout=90)

            done = asyncio.run(check(Env(url=url, settings=settings, token=token, repo_path=path)))
            files = tree_files(path, done["head_sha"])
    assert done["state"] == "awaiting_review", done
    assert files["safe.txt"][1] == b"SAFE\n" and "raw.txt" not in files
    first_results = {m["tool_call_id"]: m["content"] for m in model.requests[1]["messages"] if m["role"] == "tool"}
    assert first_results["n1"].startswith("error: the arguments are not valid JSON")
    assert first_results["x" * 300].startswith("error: a tool call id must be at most 200 characters")
    assert first_results["b1"].startswith("exit code 0")
    asked = [b["data"]["kind"] for b in asker.seen if b["type"] == "user_prompt_submit"]
    assert asked == ["goal", "answer"]  # the denial's reason was asked about like an answer
