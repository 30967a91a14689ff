"""Issue 15's "done when", as an operator sees it: one repository runs the same goal with each of
the three families of agents (`claude-code`, `codex`, and the ACP runtime with both shipped
adapters), under one policy consumer, the shipped reference consumer
(`forgehand hooks serve --deny-tool-pattern ^Bash$`) as a real process. `forgehand serve` runs as
its own process with its in-process worker, the real engine and the agents image, its Anthropic
and OpenAI-compatible providers pointed at scripted servers on 127.0.0.1. In every transcript the
file edit lands and the shell call is refused, visibly, with the same `pre_tool_use` contract."""

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from forge.git import RepoStore
from tests.support.anthropic import ScriptedAnthropic, Turn, text, tool_use
from tests.support.codex import add_file
from tests.support.codex_acp import CodexAcpResponses, exec_command
from tests.support.openai_responses import custom_tool_call
from tests.support.openai_responses import text as said
from tests.support.policy import decisions, make_hook_token, reference_consumer
from tests.support.ports import free_port
from tests.support.serve_process import prepare, serving
from tests.support.tasks import all_events, tree_files, wait_state

pytestmark = pytest.mark.docker

ANTHROPIC_KEY = "sk-ant-every-agent-key-0123456789"
OPENAI_KEY = "sk-openai-every-agent-key-0123456789"
TASKS = "/api/v1/repos/ana/demo/tasks"
GOAL = "write hello.txt, then leave a marker file"

# Task number -> what the task is started with; they run one after the other, in this order.
AGENTS: dict[int, dict[str, str]] = {
    1: {"runtime": "claude-code"},
    2: {"runtime": "codex"},
    3: {"runtime": "acp", "agent_command": "claude-agent-acp"},
    4: {"runtime": "acp", "agent_command": "codex-acp"},
}


def titles(body: dict[str, Any]) -> Turn | None:
    """The Claude ACP adapter asks for a session title (a request without tools) beside the turns."""
    return None if body.get("tools") else text("A session title")


def claude_turns(n: int) -> list[Turn]:
    return [
        tool_use("Write", {"file_path": "/workspace/hello.txt", "content": f"hello from task {n}\n"}, id=f"toolu_w{n}"),
        tool_use("Bash", {"command": f"touch /workspace/marker{n}", "description": "marker"}, id=f"toolu_b{n}"),
        text("Wrote hello.txt; the shell was refused."),
    ]


def codex_turns(n: int) -> list[Any]:
    return [
        custom_tool_call("apply_patch", add_file("/workspace/hello.txt", f"hello from task {n}"), f"call_w{n}"),
        exec_command(f"touch /workspace/marker{n}", f"call_b{n}"),
        said("Wrote hello.txt; the shell was refused."),
    ]


async def test_one_consumer_denies_a_shell_call_in_every_agent_s_transcript(tmp_path: Path, agents_image: str) -> None:
    """Over 30 s: one task for each agent runtime (real CLIs in real sandboxes) against the same
    consumer, since the point is that one consumer governs them all alike."""
    port = free_port()
    anthropic_turns = claude_turns(1) + claude_turns(3)
    responses_turns = codex_turns(2) + codex_turns(4)
    done: dict[int, dict[str, Any]] = {}
    events: dict[int, list[dict[str, Any]]] = {}
    with ScriptedAnthropic(anthropic_turns, side=titles) as claude, CodexAcpResponses(responses_turns) as openai:
        settings, token = await prepare(tmp_path, port)
        admin = await make_hook_token(settings)
        providers = {
            "FORGEHAND_ANTHROPIC_BASE_URL": claude.url,
            "FORGEHAND_ANTHROPIC_API_KEY": ANTHROPIC_KEY,
            "FORGEHAND_ANTHROPIC_MODEL": "claude-test",
            "FORGEHAND_MODEL_BASE_URL": openai.url,
            "FORGEHAND_MODEL_API_KEY": OPENAI_KEY,
            "FORGEHAND_MODEL_NAME": "gpt-5.5",
            "FORGEHAND_WEBHOOKS_ALLOWED_HOSTS": "127.0.0.1",
        }
        url = f"http://127.0.0.1:{port}"
        with serving(settings, port, **providers), reference_consumer(url, admin, "^Bash$") as consumer:
            async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30) as c:
                for n, agent in AGENTS.items():
                    r = await c.post(TASKS, json={"goal": GOAL, "agent": "fixer", **agent})
                    assert r.status_code == 201, r.text
                    assert r.json()["number"] == n
                    done[n] = await wait_state(c, n, "awaiting_review", "failed", timeout=240)
                    events[n] = await all_events(c, n)
    repo = RepoStore(settings.data_dir / "repos").path(("ana", "demo"))

    for n, agent in AGENTS.items():
        task, transcript = done[n], events[n]
        notices = [e["payload"] for e in transcript if e["kind"] in ("notice", "system")]
        assert task["state"] == "awaiting_review", (agent, task, notices)
        assert task["runs"][0]["agent_name"] == agent.get("agent_command", agent["runtime"])
        # The edit landed; the refused shell call left nothing behind.
        files = tree_files(repo, task["head_sha"])
        assert files["hello.txt"][1] == f"hello from task {n}\n".encode(), agent
        assert f"marker{n}" not in files, agent
        # The deny shows in the transcript: the policy record and the refused call's result.
        policy = [
            e["payload"]["text"] for e in transcript if e["kind"] == "system" and e["payload"]["phase"] == "policy"
        ]
        assert any(t.startswith("pre_tool_use: deny (") for t in policy), (agent, policy)
        call_id = f"toolu_b{n}" if n in (1, 3) else f"call_b{n}"
        [result] = [e["payload"] for e in transcript if e["kind"] == "tool_result" and e["payload"]["id"] == call_id]
        assert result["is_error"] is True, (agent, result)
        for key in (ANTHROPIC_KEY, OPENAI_KEY):
            assert key not in json.dumps(transcript)

    # The one consumer saw the same contract from every agent: the shell as `Bash` with its exact
    # command (denied), the edit under the agent's own tool name (allowed).
    seen = [d for d in decisions(consumer) if d.get("event") == "pre_tool_use"]
    bash = [d for d in seen if d.get("tool_name") == "Bash"]
    assert [d["decision"] for d in bash] == ["deny"] * len(AGENTS), seen
    assert all(d["decision"] != "deny" for d in seen if d.get("tool_name") != "Bash"), seen
    edits = {d.get("tool_name") for d in seen if d.get("tool_name") != "Bash"}
    assert edits == {"Write", "apply_patch"}, seen
