"""The claude-code walkthrough of `make run`, as a user does it: `forgehand serve` as its own process
(its in-process worker, the real engine, the agents image with the pinned CLI) configured with an
Anthropic endpoint (a scripted server on 127.0.0.1) and the shipped reference policy consumer
(`forgehand hooks serve --deny-tool-pattern ^Bash$`) as a real process. A task on the demo repository
edits a file while its Bash call is blocked visibly in the transcript; a review that requests
changes continues the same Claude session; approval and merge put the work on main."""

import json
from pathlib import Path

import httpx
import pygit2
import pytest

from forge.git import RepoStore
from tests.support.anthropic import ScriptedAnthropic, text, tool_use
from tests.support.policy import decisions, make_hook_token, reference_consumer
from tests.support.ports import free_port
from tests.support.serve_process import prepare, serving
from tests.support.tasks import all_events, tree_files, wait_state

pytestmark = pytest.mark.docker

KEY = "sk-ant-walkthrough-key-0123456789abcdef"
TASKS = "/api/v1/repos/ana/demo/tasks"


async def test_make_run_walkthrough_edit_deny_review_resume_merge(tmp_path: Path, agents_image: str) -> None:
    """Over 30 s: the README's walkthrough with the real Claude Code CLI in two real sandbox runs
    (an edit and a denied shell call, then changes requested, the session resumed, the merge)."""
    turns = [
        tool_use("Bash", {"command": "touch /workspace/pwned", "description": "marker"}, id="toolu_bash"),
        tool_use("Write", {"file_path": "/workspace/hello.txt", "content": "hello v1\n"}),
        text("Wrote hello.txt; the shell was refused."),
        tool_use("Write", {"file_path": "/workspace/hello.txt", "content": "hello v2\n"}),
        text("Changed it as asked."),
    ]
    port = free_port()
    with ScriptedAnthropic(turns) as api:
        settings, token = await prepare(tmp_path, port)
        admin = await make_hook_token(settings)
        model = {
            "FORGEHAND_ANTHROPIC_BASE_URL": api.url,
            "FORGEHAND_ANTHROPIC_API_KEY": KEY,
            "FORGEHAND_ANTHROPIC_MODEL": "claude-walkthrough",
            "FORGEHAND_WEBHOOKS_ALLOWED_HOSTS": "127.0.0.1",
        }
        url = f"http://127.0.0.1:{port}"
        with serving(settings, port, **model), reference_consumer(url, admin, "^Bash$") as consumer:
            headers = {"Authorization": f"Bearer {token}"}
            async with httpx.AsyncClient(base_url=url, headers=headers, timeout=30) as c:
                r = await c.post(TASKS, json={"goal": "write hello.txt", "agent": "fixer", "runtime": "claude-code"})
                assert r.status_code == 201, r.text
                first = await wait_state(c, 1, "awaiting_review", "failed", timeout=240)
                assert first["state"] == "awaiting_review", first
                events = await all_events(c, 1)
                page = (await c.get("/ana/demo/tasks/1")).text

                r = await c.post(f"{TASKS}/1/reviews", json={"verdict": "request_changes", "body": "make it v2"})
                assert r.status_code == 201, r.text
                second = first
                while len(second["runs"]) < 2 or second["state"] != "awaiting_review":
                    second = await wait_state(c, 1, "awaiting_review", "failed", timeout=240)
                    assert second["state"] != "failed", second

                review = {"verdict": "approve", "commit_sha": second["head_sha"]}
                assert (await c.post(f"{TASKS}/1/reviews", json=review)).status_code == 201
                merge = {"strategy": "merge", "expected_head_sha": second["head_sha"]}
                r = await c.post(f"{TASKS}/1/merge", json=merge)
                assert r.status_code == 200, r.text
                merged = (await c.get(f"{TASKS}/1")).json()
    repo = RepoStore(settings.data_dir / "repos").path(("ana", "demo"))
    main_sha = str(pygit2.Repository(str(repo)).revparse_single("refs/heads/main").id)

    # The file edit landed on the task branch; the blocked shell call left nothing behind.
    files = tree_files(repo, first["head_sha"])
    assert files["hello.txt"][1] == b"hello v1\n" and "pwned" not in files
    # The deny is visible in the transcript (the policy record and the refused tool result) and on the page.
    policy = [e["payload"]["text"] for e in events if e["kind"] == "system" and e["payload"].get("phase") == "policy"]
    assert [t for t in policy if t.startswith("pre_tool_use: deny")] == [next(t for t in policy if "deny" in t)]
    [refused] = [e["payload"] for e in events if e["kind"] == "tool_result" and e["payload"]["id"] == "toolu_bash"]
    assert refused["is_error"] is True
    assert 'class="policy-line decision-deny"' in page  # the decision, in the card of the call it decided
    # The consumer saw every tool call of both runs and denied only the shell.
    seen = [(d.get("tool_name"), d.get("decision")) for d in decisions(consumer) if d.get("event") == "pre_tool_use"]
    assert ("Bash", "deny") in seen and all(d != "deny" for name, d in seen if name != "Bash")
    # The review run continued the first run's session: same id, one conversation.
    assert first["agent_session_id"] and second["agent_session_id"] == first["agent_session_id"]
    assert [run["kind"] for run in second["runs"]] == ["start", "review"]
    said = json.dumps(api.requests[-1]["messages"])
    assert "write hello.txt" in said and "make it v2" in said
    # Approved and merged: main has the second version; the real key never reached the transcript.
    assert merged["state"] == "merged", merged
    assert tree_files(repo, main_sha)["hello.txt"][1] == b"hello v2\n"
    assert KEY not in json.dumps(events)
    assert all(KEY not in json.dumps(body) for body in api.requests)
