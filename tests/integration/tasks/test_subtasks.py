"""Subtasks an agent spawns through its back-channel (no worker: the runs stay queued): a task of
its own linked both ways, its branch from the parent's last commit, its budget out of what the
parent's run has left; the repository's depth and count limits refuse with nothing created; every
spawn audited; stopping a parent stops its children; progress notes reach the transcript and the
notification webhooks, rate-limited."""

from typing import Any

import msgspec
import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy import func, select

from forge.core.settings import Settings
from forge.db.engine import Database
from forge.db.models import AuditEvent, Repository
from tasks.core.models import Run, Task
from tasks.core.states import TaskState
from tasks.run.backchannel import ToolRefused
from tests.support.backchannel import backchannel_for
from tests.support.gateway import Recorder
from tests.support.policy import PolicyConsumer
from tests.support.task_world import TASKS, World, agent_commits, build_task_world
from tests.support.web import csrf_from, sign_in
from tests.support.webhooks import config, make_endpoint
from webhooks.core.models import WebhookOutbox

pytestmark = pytest.mark.db


@pytest.fixture
def settings(settings: Settings) -> Settings:
    return msgspec.structs.replace(settings, webhooks_allowed_hosts="127.0.0.1")


@pytest.fixture
async def world(db: Database, settings: Settings) -> World:
    return await build_task_world(db, settings)


def with_model(settings: Settings) -> Settings:
    return msgspec.structs.replace(settings, model_base_url="http://127.0.0.1:9/v1", model_name="scripted")


# The parents here are command tasks, a runtime no subtask may use: their subtasks run builtin.
OTHER_RUNTIMES = {"subtask_runtimes": ["builtin"]}


async def start(client: AsyncTestClient[Litestar], world: World, *, other_runtimes: bool = True) -> dict[str, Any]:
    if other_runtimes:
        r = await client.put("/api/v1/repos/ana/demo/task-settings", json=OTHER_RUNTIMES, headers=world.h("ana"))
        assert r.status_code == 200 and r.json()["subtask_runtimes"] == ["builtin"], r.text
    body = {"goal": "the big job", "agent": "fixer", "command": "true", "title": "Parent"}
    r = await client.post(TASKS, json=body, headers=world.h("ana"))
    assert r.status_code == 201, r.text
    return dict(r.json())


async def task_count(db: Database) -> int:
    async with db.session() as s:
        return int((await s.execute(select(func.count(Task.id)))).scalar_one())


async def audits(db: Database, action: str) -> list[AuditEvent]:
    async with db.session() as s:
        return list((await s.execute(select(AuditEvent).where(AuditEvent.action == action))).scalars())


async def test_a_spawned_subtask_is_a_task_of_its_own_linked_both_ways(
    client: AsyncTestClient[Litestar], world: World, db: Database, settings: Settings
) -> None:
    await start(client, world)
    head = await agent_commits(db, settings, 1, {"part1.txt": b"parent's work\n"}, "part one")
    async with db.session(write=True) as s:  # the parent's run goes on with that work committed
        (await s.execute(select(Task).where(Task.number == 1))).scalar_one().state = TaskState.RUNNING
    bc = await backchannel_for(client.app, db, 1, settings=with_model(settings), remaining=5000)
    text = await bc.spawn_subtask("Write the docs", "Document the parser in docs/parser.md.", "builtin", 3000)
    assert "subtask #2 created" in text and "3000 tokens per run" in text
    # A task of its own: the parent's agent and starter, its own branch from the parent's head.
    child = (await client.get(f"{TASKS}/2", headers=world.h("ana"))).json()
    assert child["parent"] == {"number": 1} and child["state"] == "queued"
    assert child["agent"] == "fixer" and child["started_by"] == "ana" and child["runtime"] == "builtin"
    assert (
        child["base"] == "main" and child["base_sha"] == head and child["branch"].startswith("agent/2-write-the-docs")
    )
    assert child["goal"] == "Document the parser in docs/parser.md." and child["title"] == "Write the docs"
    parent = (await client.get(f"{TASKS}/1", headers=world.h("ana"))).json()
    assert parent["parent"] is None and parent["subtasks"] == 1
    listed = (await client.get(f"{TASKS}/1/subtasks", headers=world.h("ana"))).json()
    assert [t["number"] for t in listed] == [2]
    assert (await client.get(f"{TASKS}/2/subtasks", headers=world.h("ana"))).json() == []
    events = (await client.get(f"{TASKS}/1/transcript", headers=world.h("ana"))).json()["events"]
    spawned = [e["payload"] for e in events if e["kind"] == "subtask"]
    assert spawned == [{"event": "spawned", "number": 2, "text": "Write the docs", "state": "queued", "summary": ""}]
    async with db.session() as s:
        row = (await s.execute(select(Task).where(Task.number == 2))).scalar_one()
        assert row.token_budget == 3000 and row.depth == 1
    [spawn_audit] = await audits(db, "task.subtask.spawn")
    assert spawn_audit.result == "ok" and spawn_audit.target == "ana/demo#2" and spawn_audit.actor_login == "fixer"
    assert spawn_audit.detail["parent"] == 1 and spawn_audit.detail["token_budget"] == 3000
    # What this run hands out comes off what it has left: 8000 asked, 2000 of the 5000 left.
    text = await bc.spawn_subtask("More", "Another part.", "builtin", 8000)
    assert "subtask #3 created" in text and "2000 tokens per run" in text
    with pytest.raises(ToolRefused, match="budget is used up"):
        await bc.spawn_subtask("Too much", "Yet another.", "builtin", None)


async def test_a_stopping_or_ended_parent_cannot_spawn(
    client: AsyncTestClient[Litestar], world: World, db: Database, settings: Settings
) -> None:
    """A stop's cascade has gone over the children already: a child made after it would run on alone."""
    await start(client, world)
    bc = await backchannel_for(client.app, db, 1, settings=with_model(settings), remaining=5000)
    async with db.session(write=True) as s:
        (await s.execute(select(Run).where(Run.task_id == bc.task_id))).scalar_one().stop_requested = True
    with pytest.raises(ToolRefused, match="stopping or no longer running"):
        await bc.spawn_subtask("Late", "too late", "builtin", 100)
    assert await task_count(db) == 1


async def test_over_the_limits_the_agent_is_refused_and_nothing_is_created(
    client: AsyncTestClient[Litestar], world: World, db: Database, settings: Settings
) -> None:
    await start(client, world)
    limits = {"max_subtasks": 1, "max_subtask_depth": 2, **OTHER_RUNTIMES}
    r = await client.put("/api/v1/repos/ana/demo/task-settings", json=limits, headers=world.h("ana"))
    assert r.status_code == 200 and r.json()["max_subtasks"] == 1, r.text
    bc = await backchannel_for(client.app, db, 1, settings=with_model(settings))
    before = await task_count(db)
    with pytest.raises(ToolRefused, match="unknown runtime 'command'"):
        await bc.spawn_subtask("Three", "A command.", None)  # the parent's runtime: not for an agent to spawn
    with pytest.raises(ToolRefused, match="needs a name and instructions"):
        await bc.spawn_subtask("", "x", "builtin")
    assert await task_count(db) == before
    await bc.spawn_subtask("One", "The one allowed.", "builtin")
    before = await task_count(db)
    with pytest.raises(ToolRefused, match="at most 1 subtasks"):
        await bc.spawn_subtask("Two", "One too many.", "builtin")
    # Depth: the child (depth 1) may spawn, the grandchild (depth 2) may not.
    child = await backchannel_for(client.app, db, 2, settings=with_model(settings))
    await child.spawn_subtask("Grandchild", "Deeper.", "builtin")
    grandchild = await backchannel_for(client.app, db, 3, settings=with_model(settings))
    with pytest.raises(ToolRefused, match="nest at most 2 deep"):
        await grandchild.spawn_subtask("Too deep", "Deepest.", "builtin")
    assert await task_count(db) == before + 1  # only the grandchild
    refused = [a for a in await audits(db, "task.subtask.spawn") if a.result == "refused"]
    assert len(refused) == 4 and "at most 1 subtasks" in refused[2].detail["reason"]
    # 0 turns subtasks off.
    r = await client.put("/api/v1/repos/ana/demo/task-settings", json={"max_subtask_depth": 0}, headers=world.h("ana"))
    assert r.status_code == 200
    with pytest.raises(ToolRefused, match="nest at most 0 deep"):
        await bc.spawn_subtask("Off", "Off.", "builtin")


async def test_stopping_a_parent_stops_its_subtasks_and_the_parent_hears_of_it(
    client: AsyncTestClient[Litestar], world: World, db: Database, settings: Settings
) -> None:
    await start(client, world)
    bc = await backchannel_for(client.app, db, 1, settings=with_model(settings))
    await bc.spawn_subtask("A", "Part A.", "builtin")
    child = await backchannel_for(client.app, db, 2, settings=with_model(settings))
    await child.spawn_subtask("A1", "Part A1.", "builtin")
    r = await client.post(f"{TASKS}/1/stop", headers=world.h("ana"))
    assert r.status_code == 200 and r.json()["state"] == "stopped", r.text
    states = {n: (await client.get(f"{TASKS}/{n}", headers=world.h("ana"))).json()["state"] for n in (1, 2, 3)}
    assert states == {1: "stopped", 2: "stopped", 3: "stopped"}
    events = (await client.get(f"{TASKS}/1/transcript", headers=world.h("ana"))).json()["events"]
    ended = [e["payload"] for e in events if e["kind"] == "subtask" and e["payload"]["event"] == "ended"]
    assert ended == [
        {"event": "ended", "number": 2, "text": "subtask #2 was stopped", "state": "stopped", "summary": ""}
    ]


async def test_progress_notes_reach_the_transcript_and_the_webhooks_rate_limited(
    client: AsyncTestClient[Litestar], world: World, db: Database, settings: Settings
) -> None:
    await start(client, world)
    async with db.session() as s:
        row = (await s.execute(select(Repository).where(Repository.name == "demo"))).scalar_one()
    await make_endpoint(db, config(settings), row, "http://127.0.0.1:1/hook", events=["task.progress"])
    clock = [100.0]
    emit = Recorder()
    bc = await backchannel_for(client.app, db, 1, emit=emit, clock=lambda: clock[0])
    for i in range(5):
        assert await bc.record_progress(f"step {i}") == "noted"
    with pytest.raises(ToolRefused, match="too many progress notes"):
        await bc.record_progress("step 5")
    clock[0] += 10
    assert await bc.record_progress("step 6") == "noted"
    assert [p.text for k, p in emit.events if k == "progress"] == [f"step {i}" for i in (0, 1, 2, 3, 4, 6)]
    async with db.session() as s:
        rows = list(
            (await s.execute(select(WebhookOutbox).where(WebhookOutbox.event_type == "task.progress"))).scalars()
        )
    assert len(rows) == 6
    body = msgspec.json.decode(rows[0].body)
    assert body["data"] == {"message": "step 0"}
    assert body["meta"]["task"]["number"] == 1 and body["meta"]["task"]["parent"] is None
    assert body["meta"]["actor"] == {"login": "fixer", "type": "Bot"}


async def test_the_task_page_shows_the_tree_and_offers_the_questions_options(
    client: AsyncTestClient[Litestar], world: World, db: Database, settings: Settings
) -> None:
    await start(client, world)
    bc = await backchannel_for(client.app, db, 1, settings=with_model(settings))
    await bc.spawn_subtask("Write the docs", "Docs.", "builtin")
    async with db.session(write=True) as s:  # as a run that asked would leave it
        child = (await s.execute(select(Task).where(Task.number == 2))).scalar_one()
        child.state, child.question, child.question_options = "blocked", "Which format?", ["markdown", "rst"]
    assert (await sign_in(client, "ana", "correct horse battery")).status_code in (302, 303)
    parent_page = (await client.get("/ana/demo/tasks/1")).text
    tree = parent_page[parent_page.index('id="subtasks"') :]
    assert 'href="/ana/demo/tasks/2">#2 Write the docs</a>' in tree and "state-blocked" in tree
    child_page = (await client.get("/ana/demo/tasks/2")).text
    assert 'id="parent-link">#1</a>' in child_page
    offered = child_page[child_page.index('id="question-options"') :]
    assert 'name="body" value="markdown">markdown</button>' in offered and 'value="rst">rst</button>' in offered
    r = await client.post(
        "/ana/demo/tasks/2/answer", data={"csrf_token": csrf_from(offered), "body": "rst"}, follow_redirects=False
    )
    assert r.status_code == 303, r.text
    answered = (await client.get(f"{TASKS}/2", headers=world.h("ana"))).json()
    assert answered["state"] == "queued" and answered["question"] == "" and answered["question_options"] == []
    assert answered["runs"][-1]["kind"] == "answer"


class GoalPolicy(PolicyConsumer):
    """Denies a goal that mentions "forbidden"; allows everything else."""

    def answer(self, body: dict[str, Any]) -> tuple[int, dict[str, Any] | None]:
        if body["type"] == "user_prompt_submit" and "forbidden" in body["data"]["prompt"]:
            return 200, {"permission": {"decision": "deny", "reason": "not that"}}
        return 200, None


async def test_a_subtasks_goal_passes_the_prompt_policy_which_sees_the_parent(
    client: AsyncTestClient[Litestar], world: World, db: Database, settings: Settings
) -> None:
    policy = GoalPolicy()
    try:
        hook = {"url": policy.url, "kind": "policy", "events": ["user_prompt_submit"]}
        r = await client.post("/api/v1/repos/ana/demo/hooks", json=hook, headers=world.h("ana"))
        assert r.status_code == 201, r.text
        await start(client, world)
        bc = await backchannel_for(client.app, db, 1, settings=with_model(settings))
        await bc.spawn_subtask("Allowed", "Write the docs.", "builtin")
        before = await task_count(db)
        with pytest.raises(ToolRefused, match="refused by a policy: not that"):
            await bc.spawn_subtask("Denied", "Do the forbidden thing.", "builtin")
        assert await task_count(db) == before
    finally:
        policy.server.shutdown()
    goals = [b for b in policy.seen if b["type"] == "user_prompt_submit"]
    assert [b["data"]["kind"] for b in goals] == ["goal", "goal", "goal"]
    assert [b["meta"]["task"]["parent"] for b in goals] == [None, {"number": 1}, {"number": 1}]
    assert goals[1]["meta"]["task"]["number"] == 2 and goals[1]["meta"]["actor"]["login"] == "fixer"


async def test_a_subtask_keeps_its_parents_runtime_unless_the_repository_allows_others(
    client: AsyncTestClient[Litestar], world: World, db: Database, settings: Settings
) -> None:
    await start(client, world, other_runtimes=False)
    async with db.session(write=True) as s:  # a builtin parent (started as a command task: no model needed)
        (await s.execute(select(Task).where(Task.number == 1))).scalar_one().runtime = "builtin"
    runtimes = frozenset({"builtin", "claude-code", "codex", "command"})
    bc = await backchannel_for(client.app, db, 1, settings=with_model(settings), runtimes=runtimes)
    before = await task_count(db)
    for other in ("codex", "claude-code"):
        with pytest.raises(ToolRefused, match=rf"runs on this task's runtime \(builtin\).*{other!r} is not listed"):
            await bc.spawn_subtask("Elsewhere", "On another agent.", other)
    assert await task_count(db) == before  # nothing created
    refusals = [a.detail for a in await audits(db, "task.subtask.spawn") if a.result == "refused"]
    assert [d["runtime"] for d in refusals] == ["codex", "claude-code"]
    assert "subtask #2 created" in await bc.spawn_subtask("Same", "On the parent's runtime.", None)
    assert "subtask #3 created" in await bc.spawn_subtask("Same again", "Named explicitly.", "builtin")
    # The repository lets subtasks use codex (whose OpenAI model the instance has): then it may.
    url = "/api/v1/repos/ana/demo/task-settings"
    r = await client.put(url, json={"subtask_runtimes": ["codex"]}, headers=world.h("ana"))
    assert r.status_code == 200 and r.json()["subtask_runtimes"] == ["codex"]
    made = await bc.spawn_subtask("Elsewhere", "On another agent.", "codex")
    assert "subtask #4 created" in made and "runtime codex" in made
    with pytest.raises(ToolRefused, match="'claude-code' is not listed"):
        await bc.spawn_subtask("Elsewhere", "On another agent.", "claude-code")
    bad = await client.put(url, json={"subtask_runtimes": ["Not A Runtime"]}, headers=world.h("ana"))
    assert bad.status_code == 422
