"""The builtin runtime end to end: a scripted model server on 127.0.0.1, the real engine, real git."""

import asyncio
import json
import time

import pytest

from forge.core.settings import Settings
from tests.support.model import ScriptedModel, error, reply, tool_call, tool_calls
from tests.support.tasks import (
    SECRET,
    Env,
    all_events,
    seed,
    serve,
    task_settings,
    tree_files,
    wait_state,
)

pytestmark = pytest.mark.docker


EDIT_SCRIPT = [
    tool_call("list_files", {}),
    tool_call("read_file", {"path": "README.md"}),
    tool_call("edit_file", {"path": "README.md", "old_string": "# demo", "new_string": "# Demo project"}),
    tool_calls([("bogus_tool", {}, "c_bogus"), ("write_file", "{not json", "c_bad")]),
    tool_call("write_file", {"path": "notes/todo.txt", "content": "ship it\n"}),
    tool_call("bash", {"command": "cat README.md; echo from-bash > bash.txt; echo $OPENAI_API_KEY-none"}),
    tool_call("report_summary", {"summary": "Renamed the title and added notes."}),
    reply("All done."),
]


async def test_builtin_edits_files_through_tools(settings: Settings, sandbox_image: str) -> None:
    with ScriptedModel(list(EDIT_SCRIPT)) as model:
        s = task_settings(settings, model_base_url=model.url, model_name="scripted")
        token, path = await asyncio.to_thread(lambda: asyncio.run(seed(s)))
        for url in serve(s):
            env = Env(url=url, settings=s, token=token, repo_path=path)
            async with env.client() as c:
                r = await c.post("/api/v1/repos/ana/demo/tasks", json={"goal": "fix the readme", "agent": "fixer"})
                assert r.status_code == 201, r.text
                done = await wait_state(c, 1, "awaiting_review", "failed")
                assert done["state"] == "awaiting_review", done
                assert done["summary"] == "Renamed the title and added notes."
                run = done["runs"][0]
                assert run["turns"] == 8 and run["prompt_tokens"] == 80 and run["completion_tokens"] == 40
                files = tree_files(path, done["head_sha"])
                assert files["README.md"][1] == b"# Demo project\n"
                assert files["notes/todo.txt"][1] == b"ship it\n"
                assert files["bash.txt"][1] == b"from-bash\n"
                events = await all_events(c, 1)
        # The key went to the model endpoint, never into the transcript or the sandbox.
        assert model.headers[0]["authorization"] == f"Bearer {SECRET}"
        raw = json.dumps(events)
        assert SECRET not in raw
        kinds = [e["kind"] for e in events]
        assert kinds.count("tool_call") == 8 and "assistant" in kinds and "summary" in kinds
        results = [e["payload"] for e in events if e["kind"] == "tool_result"]
        assert any(r["is_error"] and "unknown tool 'bogus_tool'" in r["output"] for r in results)
        assert any(r["is_error"] and "not valid JSON" in r["output"] for r in results)
        bash = next(r for r in results if r["name"] == "bash")
        assert "exit code 0" in bash["output"] and "# Demo project" in bash["output"] and "-none" in bash["output"]
        # The tool errors went back to the model as tool messages.
        fifth = model.requests[4]["messages"]
        tool_msgs = {m["tool_call_id"]: m["content"] for m in fifth if m["role"] == "tool"}
        assert "unknown tool" in tool_msgs["c_bogus"] and "not valid JSON" in tool_msgs["c_bad"]
        assert {t["function"]["name"] for t in model.requests[0]["tools"]} >= {"bash", "ask_user", "edit_file"}


async def test_ask_user_blocks_then_the_answer_resumes_the_conversation(settings: Settings, sandbox_image: str) -> None:
    script = [
        tool_call("write_file", {"path": "draft.txt", "content": "v1\n"}),
        tool_call("ask_user", {"question": "Which colour?"}, call_id="c_ask"),
        tool_call("write_file", {"path": "colour.txt", "content": "blue\n"}),
        reply("Used blue."),
    ]
    with ScriptedModel(script) as model:
        s = task_settings(settings, model_base_url=model.url, model_name="scripted")
        token, path = await asyncio.to_thread(lambda: asyncio.run(seed(s)))
        for url in serve(s):
            env = Env(url=url, settings=s, token=token, repo_path=path)
            async with env.client() as c:
                await c.post("/api/v1/repos/ana/demo/tasks", json={"goal": "paint it", "agent": "fixer"})
                blocked = await wait_state(c, 1, "blocked", "failed", "awaiting_review")
                assert blocked["state"] == "blocked" and blocked["question"] == "Which colour?", blocked
                assert "draft.txt" in tree_files(path, blocked["head_sha"])  # the work so far is on the branch
                assert (await c.post("/api/v1/repos/ana/demo/tasks/1/retry")).status_code == 409
                r = await c.post("/api/v1/repos/ana/demo/tasks/1/answer", json={"body": "blue"})
                assert r.status_code == 200 and r.json()["state"] == "queued", r.text
                done = await wait_state(c, 1, "awaiting_review", "failed")
                assert done["state"] == "awaiting_review", done
                assert [run["kind"] for run in done["runs"]] == ["start", "answer"]
                assert [run["state"] for run in done["runs"]] == ["blocked", "succeeded"]
                files = tree_files(path, done["head_sha"])
                assert files["colour.txt"][1] == b"blue\n" and files["draft.txt"][1] == b"v1\n"
                kinds = [e["kind"] for e in await all_events(c, 1)]
                assert "question" in kinds
        resumed = model.requests[2]["messages"]
        assert resumed[1] == {"role": "user", "content": "paint it"}
        assert {"role": "tool", "tool_call_id": "c_ask", "content": "blue"} in resumed
        assert len(resumed) > len(model.requests[1]["messages"])


async def test_turn_limit_fails_the_run(settings: Settings, sandbox_image: str) -> None:
    with ScriptedModel([tool_call("bash", {"command": "echo again >> loop.txt"})], repeat_last=True) as model:
        s = task_settings(settings, model_base_url=model.url, model_name="scripted", task_turn_limit=3)
        token, path = await asyncio.to_thread(lambda: asyncio.run(seed(s)))
        for url in serve(s):
            env = Env(url=url, settings=s, token=token, repo_path=path)
            async with env.client() as c:
                await c.post("/api/v1/repos/ana/demo/tasks", json={"goal": "loop", "agent": "fixer"})
                done = await wait_state(c, 1, "failed", "awaiting_review")
        assert done["state"] == "failed" and done["failure_reason"] == "turn_limit"
        assert "turn limit reached" in done["error"] and done["runs"][0]["turns"] == 3
        assert len(model.requests) == 3
        assert done["head_is_wip"] and tree_files(path, done["head_sha"])["loop.txt"][1] == b"again\n" * 3


async def test_model_429_and_5xx_are_retried_honouring_retry_after(settings: Settings, sandbox_image: str) -> None:
    with ScriptedModel([error(429, retry_after="1"), error(503), reply("nothing to do")]) as model:
        s = task_settings(settings, model_base_url=model.url, model_name="scripted")
        token, path = await asyncio.to_thread(lambda: asyncio.run(seed(s)))
        for url in serve(s):
            env = Env(url=url, settings=s, token=token, repo_path=path)
            async with env.client() as c:
                t0 = time.monotonic()
                await c.post("/api/v1/repos/ana/demo/tasks", json={"goal": "noop", "agent": "fixer"})
                done = await wait_state(c, 1, "awaiting_review", "failed")
        assert done["state"] == "awaiting_review" and done["summary"] == "nothing to do", done
        assert done["head_sha"] == done["base_sha"]  # no changes: no new commit
        assert len(model.requests) == 3 and time.monotonic() - t0 >= 1.0


async def test_model_unreachable_is_said_early(settings: Settings, sandbox_image: str) -> None:
    s = task_settings(settings, model_base_url="http://127.0.0.1:9/v1", model_name="m", model_timeout_seconds=2)
    token, path = await asyncio.to_thread(lambda: asyncio.run(seed(s)))
    for url in serve(s):
        env = Env(url=url, settings=s, token=token, repo_path=path)
        async with env.client() as c:
            await c.post("/api/v1/repos/ana/demo/tasks", json={"goal": "noop", "agent": "fixer"})
            done = await wait_state(c, 1, "failed", "awaiting_review", timeout=120)
    assert done["failure_reason"] == "model_unreachable" and "unreachable" in done["error"]
