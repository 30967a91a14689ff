"""A task's pull request under the rules a person's follows, over its REST API, without a worker
(the agent's run is stood in for by a real commit on the task branch): a blocked merge answers
`branch_rule_unmet` with `unmet_rules` as a person's pull request does, and the task's bot cannot
approve its own work, whatever the repository allows review agents. Real database, real git."""

from typing import Any

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient

from forge.core.settings import Settings
from forge.db.engine import Database
from forge.git import RepoStore
from forge.git.bare import write_commit
from tests.support.task_world import AGENT, BASE_FILES, TASKS, World, agent_commits, build_task_world, open_task_pull

pytestmark = pytest.mark.db

REPO = "/api/v1/repos/ana/demo"
PULLS = f"{REPO}/pulls"


@pytest.fixture
async def world(db: Database, settings: Settings) -> World:
    return await build_task_world(db, settings)


async def _task_pull(client: AsyncTestClient[Litestar], world: World, db: Database, settings: Settings) -> str:
    """Task #1 by fixer, started by ana, in review with a commit, and its pull request #1; its head."""
    start = {"goal": "greet", "agent": "fixer", "command": "true", "title": "Greet"}
    r = await client.post(TASKS, json=start, headers=world.h("ana"))
    assert r.status_code == 201, r.text
    head = await agent_commits(db, settings, 1, {"hello.txt": b"hello\n"}, "greet")
    assert await open_task_pull(db, settings, "http://testserver.local") == 1
    return head


async def _person_pull(client: AsyncTestClient[Litestar], world: World, settings: Settings) -> int:
    """ana's own pull request of `feature` into main (a person's, not a task's)."""
    store = RepoStore(settings.data_dir / "repos")
    try:
        files = {**BASE_FILES, "feature.txt": b"feature\n"}
        await store.write(("ana", "demo"), write_commit, branch="feature", files=files, message="f", author=AGENT)
    finally:
        await store.close()
    r = await client.post(PULLS, json={"title": "Feature", "head": "feature", "base": "main"}, headers=world.h("ana"))
    assert r.status_code == 201, r.text
    return int(r.json()["number"])


async def test_a_task_pull_requests_blocked_merge_names_the_unmet_rules_as_a_persons(
    client: AsyncTestClient[Litestar], world: World, db: Database, settings: Settings
) -> None:
    rule = {"pattern": "main", "required_checks": ["ci/build"]}
    assert (await client.post(f"{REPO}/branch-rules", json=rule, headers=world.h("ana"))).status_code == 201
    head = await _task_pull(client, world, db, settings)
    person = await _person_pull(client, world, settings)
    unmet = ["1 approval(s) of the current head needed, 0 given", "required check ci/build has not reported"]

    # PUT as GitHub, POST as Gitea: both answer with the rules that do not hold, by the same code.
    for send in (client.put, client.post):
        r = await send(f"{PULLS}/1/merge", json={"strategy": "merge", "sha": head}, headers=world.h("ana"))
        assert r.status_code == 409 and r.json()["code"] == "branch_rule_unmet", r.text
        assert r.json()["unmet_rules"] == unmet
    task_refusal = r.json()
    # Read before merging, the pull request says the same: what its merge box lists.
    shown = (await client.get(f"{PULLS}/1", headers=world.h("ana"))).json()
    assert shown["unmet_rules"] == unmet and shown["mergeable_state"] == "blocked"
    # The same shape as a person's pull request's refusal: the same fields, a list of rules in words.
    r = await client.put(f"{PULLS}/{person}/merge", json={"strategy": "merge"}, headers=world.h("ana"))
    assert r.status_code == 409 and r.json()["code"] == "branch_rule_unmet", r.text
    assert r.json()["unmet_rules"] == ["required check ci/build has not reported"]
    assert sorted(r.json()) == sorted(task_refusal)
    # The task's own merge endpoint answers as it always did.
    r = await client.post(f"{TASKS}/1/merge", json={"expected_head_sha": head}, headers=world.h("ana"))
    assert r.status_code == 409 and r.json()["code"] == "merge_blocked", r.text
    assert r.json()["blockers"] == unmet

    # Another reason keeps its own code: a head the merging person did not read.
    r = await client.put(f"{PULLS}/1/merge", json={"sha": "0" * 40}, headers=world.h("ana"))
    assert r.status_code == 409 and r.json()["code"] == "stale_head", r.text
    assert r.json()["head_sha"] == head

    # Approved and checked, it merges through the pull request.
    r = await client.post(f"{PULLS}/1/reviews", json={"event": "APPROVE", "commit_id": head}, headers=world.h("wendy"))
    assert r.status_code == 200, r.text
    status = {"state": "success", "context": "ci/build"}
    assert (await client.post(f"{REPO}/statuses/{head}", json=status, headers=world.h("wendy"))).status_code == 201
    r = await client.put(f"{PULLS}/1/merge", json={"strategy": "merge", "sha": head}, headers=world.h("ana"))
    assert r.status_code == 200 and r.json()["merged"] is True, r.text
    assert (await client.get(f"{TASKS}/1", headers=world.h("ana"))).json()["state"] == "merged"


async def _reviews(client: AsyncTestClient[Litestar], world: World) -> list[tuple[str, str]]:
    r = await client.get(f"{PULLS}/1/reviews", headers=world.h("ana"))
    assert r.status_code == 200, r.text
    return [(x["state"], x["user"]["login"]) for x in r.json()]


async def test_a_tasks_bot_cannot_approve_its_own_pull_request(
    client: AsyncTestClient[Litestar], world: World, db: Database, settings: Settings
) -> None:
    head = await _task_pull(client, world, db, settings)
    # What the repository allows review agents (approving pull requests they were asked to review)
    # does not reach a task's own work: its bot never approves it.
    allow = {"review_agents_may_approve": True}
    r = await client.put(f"{REPO}/task-settings", json=allow, headers=world.h("ana"))
    assert r.status_code == 200 and r.json()["review_agents_may_approve"] is True, r.text

    approve: dict[str, Any] = {"event": "APPROVE", "body": "LGTM", "commit_id": head}
    r = await client.post(f"{PULLS}/1/reviews", json=approve, headers=world.h("fixer"))
    assert r.status_code == 403 and r.json()["code"] == "agent_cannot_review", r.text
    # Nor by gathering a pending review to publish, nor by a line comment.
    pending = {"comments": [{"path": "hello.txt", "line": 1, "side": "RIGHT", "body": "fine"}]}
    r = await client.post(f"{PULLS}/1/reviews", json=pending, headers=world.h("fixer"))
    assert r.status_code == 403 and r.json()["code"] == "agent_cannot_review", r.text
    line = {"path": "hello.txt", "line": 1, "body": "fine"}  # a line comment is a comment review of the task
    r = await client.post(f"{PULLS}/1/comments", json=line, headers=world.h("fixer"))
    assert r.status_code == 403 and r.json()["code"] == "agent_cannot_review", r.text

    # The pull request stays unapproved: no review, and the merge is refused for want of one.
    assert await _reviews(client, world) == []
    assert (await client.get(f"{PULLS}/1/comments", headers=world.h("ana"))).json() == []
    status = (await client.get(f"{TASKS}/1/review-status", headers=world.h("ana"))).json()
    assert status["approvals"] == [] and status["blockers"] == ["1 approval(s) of the current head needed, 0 given"]
    r = await client.put(f"{PULLS}/1/merge", json={"sha": head}, headers=world.h("ana"))
    assert r.status_code == 409 and r.json()["code"] == "branch_rule_unmet", r.text

    # A person's approval counts, and the pull request merges.
    r = await client.post(f"{PULLS}/1/reviews", json=approve, headers=world.h("wendy"))
    assert r.status_code == 200 and r.json()["state"] == "APPROVED", r.text
    assert await _reviews(client, world) == [("APPROVED", "wendy")]
    status = (await client.get(f"{TASKS}/1/review-status", headers=world.h("ana"))).json()
    assert status["approvals"] == ["wendy"] and status["blockers"] == []
    r = await client.put(f"{PULLS}/1/merge", json={"sha": head}, headers=world.h("ana"))
    assert r.status_code == 200 and r.json()["merged"] is True, r.text
