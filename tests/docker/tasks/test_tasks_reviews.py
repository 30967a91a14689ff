"""Reviews with the real worker: a change request becomes a `review` run whose prompt the agent
really receives (inline comments with their quoted code), the head moves, the old review reads
outdated, then approve and merge; and a change request denied by `user_prompt_submit` stores
nothing. Real Docker, a scripted model, a real policy consumer."""

import asyncio
import json
from http.server import BaseHTTPRequestHandler
from typing import Any

import msgspec
import pygit2
import pytest

from forge.core.settings import Settings
from tests.support.model import ScriptedModel, reply, tool_call
from tests.support.policy import PolicyConsumer, served_with_policy
from tests.support.tasks import Env, all_events, seed, serve, task_settings, tree_files, wait_state

pytestmark = pytest.mark.docker


@pytest.fixture
def review_settings(settings: Settings, sandbox_image: str) -> Settings:
    return msgspec.structs.replace(task_settings(settings), webhooks_allowed_hosts="127.0.0.1")


def test_change_request_reaches_the_agent_then_approve_and_merge(review_settings: Settings) -> None:
    turns = [
        tool_call("write_file", {"path": "hello.txt", "content": "hello\n"}),
        reply("wrote hello"),
        tool_call("write_file", {"path": "hello.txt", "content": "hi\n"}),
        reply("now it says hi"),
    ]
    with ScriptedModel(turns) as model:
        settings = msgspec.structs.replace(review_settings, model_base_url=model.url, model_name="scripted")
        token, path = asyncio.run(seed(settings))

        async def check(env: Env) -> dict[str, Any]:
            t = "/api/v1/repos/ana/demo/tasks/1"
            async with env.client() as c:
                r = await c.post("/api/v1/repos/ana/demo/tasks", json={"goal": "greet", "agent": "fixer"})
                assert r.status_code == 201, r.text
                first = await wait_state(c, 1, "awaiting_review", "failed", timeout=90)
                assert first["state"] == "awaiting_review", first
                review = {
                    "verdict": "request_changes",
                    "body": "Friendlier, please.",
                    "comments": [{"path": "hello.txt", "line": 1, "body": "say hi"}],
                }
                r = await c.post(f"{t}/reviews", json=review)
                assert r.status_code == 201, r.text
                second = await wait_state(c, 1, "awaiting_review", "failed", timeout=90)
                assert second["state"] == "awaiting_review" and second["head_sha"] != first["head_sha"], second
                assert [x["kind"] for x in second["runs"]] == ["start", "review"]
                reviews = (await c.get(f"{t}/reviews")).json()
                assert reviews[0]["outdated"] is True and reviews[0]["comments"][0]["outdated"] is True
                r = await c.post(f"{t}/reviews", json={"verdict": "approve", "commit_sha": second["head_sha"]})
                assert r.status_code == 201, r.text
                r = await c.post(f"{t}/merge", json={"strategy": "squash", "expected_head_sha": second["head_sha"]})
                assert r.status_code == 200, r.text
                events = await all_events(c, 1)
                assert any(e["kind"] == "prompt" and e["payload"]["source"] == "review" for e in events)
                return dict(r.json())

        for url in serve(settings):
            merged = asyncio.run(check(Env(url=url, settings=settings, token=token, repo_path=path)))
        repo = pygit2.Repository(str(path))
        main = repo.revparse_single("refs/heads/main").peel(pygit2.Commit)
        assert str(main.id) == merged["merged_sha"] and main.tree["hello.txt"].data == b"hi\n"
        assert tree_files(path, merged["merged_sha"])["hello.txt"][1] == b"hi\n"
        # The agent got the change request as the next user message, with the quoted line.
        asked = [m for m in model.requests[2]["messages"] if m["role"] == "user"][-1]["content"]
        assert "Friendlier, please." in asked and "hello.txt, line 1:\n> hello\nsay hi" in asked


class DenyReviews(PolicyConsumer):
    """Denies change requests that mention `forbidden`; no opinion on anything else."""

    def __init__(self) -> None:
        super().__init__({})
        outer = self

        def do_post(h: BaseHTTPRequestHandler) -> None:
            body = json.loads(h.rfile.read(int(h.headers.get("content-length", "0"))))
            outer.seen.append(body)
            answer = None
            data = body.get("data", {})
            if data.get("kind") == "review" and "forbidden" in data.get("prompt", ""):
                answer = {"permission": {"decision": "deny", "reason": "no"}, "user_message": "not that change"}
            raw = json.dumps(answer).encode() if answer is not None else b""
            h.send_response(200)
            h.send_header("content-type", "application/json")
            h.send_header("content-length", str(len(raw)))
            h.end_headers()
            h.wfile.write(raw)

        self.server.RequestHandlerClass.do_POST = do_post  # type: ignore[attr-defined]


def test_a_denied_change_request_stores_nothing(review_settings: Settings) -> None:
    consumer = DenyReviews()

    async def check(env: Env) -> None:
        t = "/api/v1/repos/ana/demo/tasks/1"
        async with env.client() as c:
            r = await c.post(
                "/api/v1/repos/ana/demo/tasks",
                json={"goal": "x", "agent": "fixer", "runtime": "command", "command": "echo hi > hi.txt"},
            )
            assert r.status_code == 201, r.text
            assert (await wait_state(c, 1, "awaiting_review", "failed", timeout=90))["state"] == "awaiting_review"
            r = await c.post(f"{t}/reviews", json={"verdict": "request_changes", "body": "do the forbidden thing"})
            assert r.status_code == 403 and r.json()["code"] == "policy_denied", r.text
            assert "not that change" in r.json()["detail"]
            assert (await c.get(f"{t}/reviews")).json() == []
            task = (await c.get(t)).json()
            assert task["state"] == "awaiting_review" and len(task["runs"]) == 1
            r = await c.post(f"{t}/reviews", json={"verdict": "request_changes", "body": "say hello instead"})
            assert r.status_code == 201, r.text
            done = await wait_state(c, 1, "awaiting_review", "failed", timeout=90)
            assert [x["kind"] for x in done["runs"]] == ["start", "review"]
            events = await all_events(c, 1)
            notices = [e["payload"]["text"] for e in events if e["kind"] == "notice"]
            assert any("the change request is in $FORGEHAND_PROMPT" in n for n in notices)

    for env in served_with_policy(review_settings, consumer, ["user_prompt_submit"]):
        asyncio.run(check(env))
    kinds = [b["data"]["kind"] for b in consumer.seen if b["type"] == "user_prompt_submit"]
    assert kinds == ["goal", "review", "review"]


def test_a_tasks_changes_are_a_pull_request_that_follows_it(review_settings: Settings) -> None:
    """A task in review with changes is a pull request from its branch into its base, opened by its
    agent on behalf of the starter; reviewed and merged as a pull request, it is the task that is
    reviewed (a change request sends the agent back on the same branch) and merged (its rules)."""
    token, path = asyncio.run(seed(review_settings))

    async def check(env: Env) -> None:
        t = "/api/v1/repos/ana/demo/tasks/1"
        pulls = "/api/v1/repos/ana/demo/pulls"
        async with env.client() as c:
            command = "date +%s%N > stamp.txt"
            r = await c.post(
                "/api/v1/repos/ana/demo/tasks",
                json={"goal": "stamp", "agent": "fixer", "runtime": "command", "command": command, "title": "Stamp"},
            )
            assert r.status_code == 201 and r.json()["pull_request"] is None, r.text
            first = await wait_state(c, 1, "awaiting_review", "failed", timeout=90)
            assert first["pull_request"] == {"number": 1, "html_url": f"{env.url}/ana/demo/pull/1"}, first
            pull = (await c.get(f"{pulls}/1")).json()
            assert (pull["title"], pull["state"], pull["user"]) == ("Stamp", "open", {"login": "fixer", "type": "Bot"})
            assert pull["head"] == {"label": "ana:" + first["branch"], "ref": first["branch"], "sha": first["head_sha"]}
            assert pull["base"]["ref"] == "main" and "started by @ana" in pull["body"]
            refused = await c.put(f"{pulls}/1/update-branch", json={})
            assert refused.status_code == 409 and refused.json()["code"] == "task_pull_request"
            assert "/ana/demo/pull/1/files" in refused.json()["detail"]  # where its review is done

            # reviewed as a pull request: the change request is the task's, and the agent runs again
            change = {"event": "REQUEST_CHANGES", "body": "again", "commit_id": first["head_sha"]}
            r = await c.post(f"{pulls}/1/reviews", json=change)
            assert r.status_code == 200 and r.json()["state"] == "CHANGES_REQUESTED", r.text
            second = await wait_state(c, 1, "awaiting_review", "failed", timeout=90)
            assert second["head_sha"] != first["head_sha"] and second["pull_request"]["number"] == 1
            assert [x["kind"] for x in second["runs"]] == ["start", "review"]
            assert (await c.get(f"{pulls}/1")).json()["head"]["sha"] == second["head_sha"]
            assert [p["number"] for p in (await c.get(pulls)).json()] == [1]  # still one pull request
            assert [r["verdict"] for r in (await c.get(f"{t}/reviews")).json()] == ["request_changes"]
            as_pull = (await c.get(f"{pulls}/1/reviews")).json()  # the task's reviews, as the pull request's
            assert [(r["state"], r["user"]["login"], r["commit_id"]) for r in as_pull] == [
                ("CHANGES_REQUESTED", "ana", first["head_sha"])
            ]

            # approved and merged as a pull request: the task's rules and merge apply
            early = await c.put(f"{pulls}/1/merge", json={"sha": second["head_sha"]})
            assert early.status_code == 409 and early.json()["code"] == "branch_rule_unmet", early.text
            assert "changes requested by ana" in early.json()["unmet_rules"], early.text
            ok = {"event": "APPROVE", "commit_id": second["head_sha"]}
            assert (await c.post(f"{pulls}/1/reviews", json=ok)).status_code == 200
            r = await c.put(f"{pulls}/1/merge", json={"strategy": "merge", "sha": second["head_sha"]})
            assert r.status_code == 200, r.text
            task = (await c.get(t)).json()
            assert task["state"] == "merged" and r.json()["sha"] == task["merged_sha"]
            merged = (await c.get(f"{pulls}/1")).json()
            assert merged["merged"] is True and merged["merge_commit_sha"] == task["merged_sha"]
            assert merged["merged_by"]["login"] == "ana"

    for url in serve(review_settings):
        asyncio.run(check(Env(url=url, settings=review_settings, token=token, repo_path=path)))
