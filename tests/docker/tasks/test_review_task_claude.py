"""A review requested from a bot whose repository runs triggered tasks on claude-code: the real CLI
in the agents image calls `submit_review` through forgehand's MCP server (the run's back-channel),
and the bot's change request with its line comment lands on the pull request as a person's would;
an approval is refused where the repository does not allow bot approvals."""

import json

import pygit2
import pytest

from forge.core.settings import Settings
from forge.git import Identity
from forge.git.bare import write_commit
from tests.support.anthropic import ScriptedAnthropic, text, tool_use
from tests.support.tasks import served, wait_state

pytestmark = pytest.mark.docker

API = "/api/v1/repos/ana/demo"
KEY = "sk-ant-instance-key-claude-0123456789"


async def test_a_claude_code_review_task_posts_the_bots_review_through_the_back_channel(
    settings: Settings, agents_image: str
) -> None:
    change = {
        "verdict": "request_changes",
        "body": "x should be 2.",
        "comments": [{"path": "x.py", "line": 1, "body": "use 2 here"}],
    }
    turns = [
        tool_use("mcp__forgehand__submit_review", {"verdict": "approve", "body": "LGTM"}, id="toolu_approve"),
        tool_use("mcp__forgehand__submit_review", change, id="toolu_review"),
        text("Reviewed."),
    ]
    with ScriptedAnthropic(turns) as api:
        model = {"anthropic_base_url": api.url, "anthropic_api_key": KEY, "anthropic_model": "claude-test"}
        async with served(settings, **model) as (env, c):
            r = await c.put(f"{API}/task-settings", json={"trigger_runtime": "claude-code"})
            assert r.status_code == 200, r.text
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
            done = await wait_state(c, 1, "awaiting_review", "failed", timeout=240)
            reviews = (await c.get(f"{API}/pulls/1/reviews")).json()
            comments = (await c.get(f"{API}/pulls/1/comments")).json()
    assert done["state"] == "awaiting_review", done
    assert done["runtime"] == "claude-code" and done["trigger"]["kind"] == "review_request"
    assert [(r["user"]["login"], r["state"], r["body"]) for r in reviews] == [
        ("fixer", "CHANGES_REQUESTED", "x should be 2.")
    ]
    assert [(x["user"]["login"], x["path"], x["line"], x["body"]) for x in comments] == [
        ("fixer", "x.py", 1, "use 2 here")
    ]
    results = {
        b["tool_use_id"]: json.dumps(b["content"])
        for body in api.requests
        for m in body["messages"]
        if isinstance(m["content"], list)
        for b in m["content"]
        if b.get("type") == "tool_result"
    }
    assert "may not approve" in results["toolu_approve"]
    assert "posted on pull request #1" in results["toolu_review"]
    offered = {t["name"] for t in api.requests[0]["tools"]}
    assert "mcp__forgehand__submit_review" in offered
