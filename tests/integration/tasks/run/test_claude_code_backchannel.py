"""The back-channel through the real Claude Code CLI's MCP client (2.1.332, on the host, against a
scripted Anthropic server): `--mcp-config` gives it forgehand's server and nothing else; its calls
to our tools pass the policy path like every tool; `ask_user` in the middle of a batch keeps the
calls before it, skips the ones after, and keeps the options."""

from pathlib import Path
from typing import Any

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient

from forge.core.settings import Settings
from forge.db.engine import Database
from tasks.core.states import RunState
from tasks.run.backchannel import attach
from tasks.run.runtimes.claude.runtime import ClaudeCodeRuntime
from tests.support.anthropic import ScriptedAnthropic, text, tool_use, turn
from tests.support.backchannel import backchannel_for, tcp_to_socket
from tests.support.claude_host import HostSandbox, Recorder, ScriptedGate, StubChannel, host_context
from tests.support.gateway import open_channel
from tests.support.task_world import TASKS, World, build_task_world

pytestmark = pytest.mark.db


@pytest.fixture
async def world(db: Database, settings: Settings) -> World:
    return await build_task_world(db, settings)


async def test_ask_user_over_mcp_mid_batch_with_the_real_cli(
    client: AsyncTestClient[Litestar], world: World, db: Database, tmp_path: Path
) -> None:
    r = await client.post(TASKS, json={"goal": "paint", "agent": "fixer", "command": "true"}, headers=world.h("ana"))
    assert r.status_code == 201, r.text
    bc = await backchannel_for(client.app, db, 1)
    ask: dict[str, Any] = {"question": "Which colour?", "options": ["red", "blue"], "task": 7}
    script = [
        turn(
            tool_use("Write", {"file_path": "BEFORE", "content": "kept\n"}, id="toolu_before"),
            tool_use("mcp__forgehand__ask_user", ask, id="toolu_ask"),
            tool_use("Write", {"file_path": "AFTER", "content": "never\n"}, id="toolu_after"),
        ),
        text("Waiting for the answer."),
    ]
    async with open_channel({}, task_id=bc.task_id, run_id=bc.run_id) as ch, tcp_to_socket(str(ch.socket_path)) as port:
        attach(ch, bc)
        with ScriptedAnthropic(script) as api:
            # The container's relay address, stood in for by a loopback port piped to the run's socket.
            sb = HostSandbox(tmp_path, api.url, rewrite={"127.0.0.1:4100": f"127.0.0.1:{port}"})
            api.turns[0].blocks[0].input["file_path"] = str(sb.workspace / "before.txt")
            api.turns[0].blocks[2].input["file_path"] = str(sb.workspace / "after.txt")
            gate, emit = ScriptedGate(), Recorder()
            ctx = host_context(sb, gate, emit, channel=StubChannel(token=ch.token), backchannel=bc)
            outcome = await ClaudeCodeRuntime().run(ctx)
    assert outcome.status is RunState.BLOCKED, outcome
    assert outcome.question == "Which colour?" and outcome.question_options == ["red", "blue"]
    assert [(q.text, q.options) for q in emit.of("question")] == [("Which colour?", ["red", "blue"])]
    assert (sb.workspace / "before.txt").read_text() == "kept\n"
    assert not (sb.workspace / "after.txt").exists()
    # The CLI listed our tools (and only ours: --strict-mcp-config) and called one through the policy.

    offered = {t["name"] for t in api.requests[0]["tools"] if t["name"].startswith("mcp__")}
    assert offered == {f"mcp__forgehand__{n}" for n in ("ask_user", "report_summary", "record_progress",
                                                        "spawn_subtask")}  # fmt: skip
    decided = [(i, name) for _, i, name in gate.events("pre_tool_use")]
    assert decided[:2] == [("toolu_before", "Write"), ("toolu_ask", "mcp__forgehand__ask_user")]
    ran = [i for _, i, _ in gate.events("post_tool_use")]
    assert "toolu_before" in ran and "toolu_after" not in ran
    # The bearer was the run's token: our server saw the question, the argument naming task 7 ignored.
    assert bc.question is not None and bc.question.text == "Which colour?"
