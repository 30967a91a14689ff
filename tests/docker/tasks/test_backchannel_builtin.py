"""The back-channel with the builtin runtime end to end (a scripted model on 127.0.0.1, the real
engine, real git): ask_user with options in the middle of a batch, answered on the task API,
continuing the same conversation; report_summary kept exactly once; a subtask spawned, run and
reported back to its parent."""

import pytest

from forge.core.settings import Settings
from tests.support.model import ScriptedModel, reply, tool_call, tool_calls
from tests.support.tasks import all_events, served, tree_files, wait_state

pytestmark = pytest.mark.docker

TASKS = "/api/v1/repos/ana/demo/tasks"


async def test_ask_user_mid_batch_keeps_earlier_calls_skips_later_ones_and_keeps_the_options(
    settings: Settings, sandbox_image: str
) -> None:
    script = [
        tool_calls(
            [
                ("write_file", {"path": "before.txt", "content": "kept\n"}, "c_before"),
                ("ask_user", {"question": "Which colour?", "options": ["red", "blue"]}, "c_ask"),
                ("write_file", {"path": "after.txt", "content": "never\n"}, "c_after"),
            ]
        ),
        tool_call("write_file", {"path": "colour.txt", "content": "blue\n"}),
        tool_call("report_summary", {"summary": "Painted it blue."}),
        tool_call("report_summary", {"summary": "A second summary."}, call_id="c_second"),
        reply("All done, and these are my last words."),
    ]
    with ScriptedModel(script) as model:
        async with served(settings, model_base_url=model.url, model_name="scripted") as (env, c):
            path = env.repo_path
            await c.post(TASKS, json={"goal": "paint it", "agent": "fixer"})
            blocked = await wait_state(c, 1, "blocked", "failed", "awaiting_review")
            assert blocked["state"] == "blocked" and blocked["question"] == "Which colour?", blocked
            assert blocked["question_options"] == ["red", "blue"]
            files = tree_files(path, blocked["head_sha"])
            assert files["before.txt"][1] == b"kept\n" and "after.txt" not in files
            r = await c.post(f"{TASKS}/1/answer", json={"body": "blue"})
            assert r.status_code == 200 and r.json()["question_options"] == [], r.text
            done = await wait_state(c, 1, "awaiting_review", "failed")
            events = await all_events(c, 1)
        assert done["state"] == "awaiting_review", done
        # The first report is the summary, over the runtime's last words, stored once.
        assert done["summary"] == "Painted it blue."
        assert done["runs"][1]["summary"] == "Painted it blue." and done["runs"][1]["summary_reported"] is True
        summaries = [e for e in events if e["kind"] == "summary"]
        assert [(e["run"], e["payload"]) for e in summaries] == [(2, {"text": "Painted it blue.", "reported": True})]
        [question] = [e["payload"] for e in events if e["kind"] == "question"]
        assert question == {"text": "Which colour?", "tool_call_id": "c_ask", "options": ["red", "blue"]}
        # The same conversation continued: the answer is the question's result, the later call was skipped.
        resumed = model.requests[1]["messages"]
        results = {m["tool_call_id"]: m["content"] for m in resumed if m["role"] == "tool"}
        assert results["c_ask"] == "blue" and results["c_after"].startswith("not run: waiting for the user")
        assert results["c_before"].startswith("wrote ")
        second = {m["tool_call_id"]: m["content"] for m in model.requests[4]["messages"] if m["role"] == "tool"}
        assert "already reported" in second["c_second"]


async def test_a_subtask_is_spawned_runs_and_reports_back_to_its_parent(settings: Settings, sandbox_image: str) -> None:
    script = [
        # The parent's run.
        tool_call("write_file", {"path": "parent.txt", "content": "mine\n"}),
        tool_call(
            "spawn_subtask",
            {"name": "Write the notes", "instructions": "Write notes.txt saying hello.", "task": 99},
            call_id="c_spawn",
        ),
        tool_call("record_progress", {"message": "handed the notes to a subtask"}),
        tool_call("report_summary", {"summary": "Split the work."}),
        reply("Parent done."),
        # The subtask's run (one run per repository at a time: after the parent's).
        tool_call("write_file", {"path": "notes.txt", "content": "hello\n"}),
        tool_call("report_summary", {"summary": "Wrote the notes."}),
        reply("Child done."),
    ]
    with ScriptedModel(script) as model:
        kw = {"model_base_url": model.url, "model_name": "scripted", "task_token_budget": 100_000}
        async with served(settings, **kw) as (env, c):
            path = env.repo_path
            await c.post(TASKS, json={"goal": "split the work", "agent": "fixer"})
            parent = await wait_state(c, 1, "awaiting_review", "failed")
            child = await wait_state(c, 2, "awaiting_review", "failed")
            subtasks = (await c.get(f"{TASKS}/1/subtasks")).json()
            parent = (await c.get(f"{TASKS}/1")).json()
            parent_events = await all_events(c, 1)
        assert parent["state"] == "awaiting_review" and parent["summary"] == "Split the work.", parent
        assert child["state"] == "awaiting_review" and child["summary"] == "Wrote the notes.", child
        assert child["parent"] == {"number": 1} and parent["parent"] is None and parent["subtasks"] == 1
        assert [(t["number"], t["state"]) for t in subtasks] == [(2, "awaiting_review")]
        # Its own branch, from the parent's last commit when it was spawned: the parent's first run had
        # not settled yet, so that is the parent's base (its uncommitted work is not in it).
        assert child["base_sha"] == parent["base_sha"] and child["branch"] != parent["branch"]
        assert "parent.txt" not in tree_files(path, child["head_sha"])
        files = tree_files(path, child["head_sha"])
        assert files["notes.txt"][1] == b"hello\n"
        # Its own budget, out of what the parent's run had left.
        assert 0 < child_budget(parent_events) <= 100_000
        kinds = [(e["kind"], e["payload"].get("event")) for e in parent_events if e["kind"] == "subtask"]
        assert kinds == [("subtask", "spawned"), ("subtask", "ended")]
        ended = [e["payload"] for e in parent_events if e["kind"] == "subtask"][-1]
        assert ended["number"] == 2 and ended["state"] == "awaiting_review" and ended["summary"] == "Wrote the notes."
        assert [e["payload"]["text"] for e in parent_events if e["kind"] == "progress"] == [
            "handed the notes to a subtask"
        ]
        spawn_result = next(m["content"] for m in model.requests[2]["messages"] if m.get("tool_call_id") == "c_spawn")
        assert spawn_result.startswith("subtask #2 created")
        # The subtask's agent got its instructions as its goal.
        assert model.requests[5]["messages"][1] == {"role": "user", "content": "Write notes.txt saying hello."}


def child_budget(events: list[dict[str, object]]) -> int:
    spawned = [e for e in events if e["kind"] == "tool_result" and e["payload"]["name"] == "spawn_subtask"]  # type: ignore[index]
    text = str(spawned[0]["payload"]["output"])  # type: ignore[index]
    return int(text.split(" tokens per run")[0].rsplit(" ", 1)[-1])
