"""A review requested from a bot, end to end with the builtin runtime (a scripted model on
127.0.0.1, the real engine, real git): the review task's agent tries to approve (refused), edits
a file (never committed), submits a change request with a line comment (the bot's review on the
pull request), and tries a second review (refused); the task is in review with no changes and no
pull request of its own."""

import pygit2
import pytest

from forge.core.settings import Settings
from forge.git import Identity
from forge.git.bare import write_commit
from tests.support.model import ScriptedModel, reply, tool_call
from tests.support.tasks import served, wait_state

pytestmark = pytest.mark.docker

API = "/api/v1/repos/ana/demo"


async def test_the_review_task_posts_the_bots_review_on_the_pull_request(
    settings: Settings, sandbox_image: str
) -> None:
    change = {
        "verdict": "request_changes",
        "body": "x should be 2.",
        "comments": [{"path": "x.py", "line": 1, "body": "use 2 here"}],
        "pull_request": 7,  # ignored: the task reviews its trigger's pull request
    }
    script = [
        tool_call("read_file", {"path": "x.py"}),
        tool_call("submit_review", {"verdict": "approve", "body": "LGTM"}, call_id="c_approve"),
        tool_call("write_file", {"path": "x.py", "content": "x = 2\n"}),
        tool_call("submit_review", change, call_id="c_review"),
        tool_call("submit_review", {"verdict": "comment", "body": "again"}, call_id="c_again"),
        reply("Reviewed."),
    ]
    with ScriptedModel(script) as model:
        async with served(settings, model_base_url=model.url, model_name="scripted") as (env, c):
            repo = pygit2.Repository(str(env.repo_path))
            repo.references.create("refs/heads/feature/x", repo.references["refs/heads/main"].target)
            write_commit(
                repo, branch="feature/x", files={"x.py": "x = 1\n"}, message="x",
                author=Identity(name="ana", email="ana@example.com"),
            )  # fmt: skip
            pull = {"title": "Add x", "head": "feature/x", "base": "main", "body": "Please approve."}
            assert (await c.post(f"{API}/pulls", json=pull)).status_code == 201
            r = await c.post(f"{API}/pulls/1/requested_reviewers", json={"reviewers": ["fixer"]})
            assert r.status_code == 201, r.text
            done = await wait_state(c, 1, "awaiting_review", "failed")
            reviews = (await c.get(f"{API}/pulls/1/reviews")).json()
            comments = (await c.get(f"{API}/pulls/1/comments")).json()
            head = (await c.get(f"{API}/pulls/1")).json()["head"]["sha"]
    assert done["state"] == "awaiting_review", done
    assert done["trigger"]["kind"] == "review_request" and done["pull_request"] is None
    assert done["head_sha"] == done["base_sha"] == head  # the edit was never committed
    assert [(r["user"]["login"], r["state"], r["body"]) for r in reviews] == [
        ("fixer", "CHANGES_REQUESTED", "x should be 2.")
    ]
    assert [(x["user"]["login"], x["path"], x["line"], x["body"]) for x in comments] == [
        ("fixer", "x.py", 1, "use 2 here")
    ]
    results = {m["tool_call_id"]: m["content"] for m in model.requests[-1]["messages"] if m["role"] == "tool"}
    assert "may not approve" in results["c_approve"]
    assert "posted on pull request #1" in results["c_review"]
    assert "already submitted" in results["c_again"]
    offered = {t["function"]["name"] for t in model.requests[0]["tools"]}
    assert "submit_review" in offered


async def test_a_review_task_that_ends_without_a_review_fails_agent_no_result(
    settings: Settings, sandbox_image: str
) -> None:
    script = [tool_call("read_file", {"path": "x.py"}), reply("Looks fine to me.")]
    with ScriptedModel(script) as model:
        async with served(settings, model_base_url=model.url, model_name="scripted") as (env, c):
            repo = pygit2.Repository(str(env.repo_path))
            repo.references.create("refs/heads/feature/x", repo.references["refs/heads/main"].target)
            write_commit(
                repo, branch="feature/x", files={"x.py": "x = 1\n"}, message="x",
                author=Identity(name="ana", email="ana@example.com"),
            )  # fmt: skip
            pull = {"title": "Add x", "head": "feature/x", "base": "main"}
            assert (await c.post(f"{API}/pulls", json=pull)).status_code == 201
            assert (await c.post(f"{API}/pulls/1/requested_reviewers", json={"reviewers": ["fixer"]})).is_success
            done = await wait_state(c, 1, "awaiting_review", "failed")
            reviews = (await c.get(f"{API}/pulls/1/reviews")).json()
    assert done["state"] == "failed" and done["failure_reason"] == "agent_no_result", done
    assert "without a review" in done["error"] and reviews == []
