"""The claude-code runtime with the real CLI in the agents image (Sandbox.spawn), its managed hook
calling back through the run's channel socket: a stand-in for the gateway (tests/support/channel.py)
plays the model and hands each hook call to the runtime's registered handler."""

import asyncio
import json
from pathlib import Path
from typing import Any

from sandbox import SandboxEngine
from tasks.core.policy import GateDecision
from tasks.core.states import RunState
from tasks.run.runtimes.claude_code import ClaudeCodeRuntime
from tests.support.channel import FakeChannel, HookCall, Reply, reply_json, text, tool_use
from tests.support.claude_host import Provider, Recorder, ScriptedGate, host_context

from .conftest import SpecFactory


class BridgedChannel:
    """The runtime's channel face over a FakeChannel: hook calls reach the registered handler."""

    container_dir = "/run/forgehand"
    container_socket = "/run/forgehand/gateway.sock"

    def __init__(self, directory: Path, turns: list[dict[str, Any]], loop: asyncio.AbstractEventLoop) -> None:
        self.handler: Any = None
        self.loop = loop
        self.fake = FakeChannel(directory, turns=turns, hook=self._hook)
        self.token = self.fake.token
        self.provider = Provider()

    def set_hook_handler(self, fn: Any) -> None:
        self.handler = fn

    def _hook(self, call: HookCall) -> Reply:
        if self.handler is None:
            return reply_json({"error": "no hook handler"}, 503)
        future = asyncio.run_coroutine_threadsafe(self.handler(call.agent, call.event, call.body), self.loop)
        return reply_json(future.result(timeout=120))


async def test_in_the_agents_image_a_denied_bash_does_not_run_and_an_allowed_write_lands(
    engine: SandboxEngine, make_spec: SpecFactory, agents_image: str, channel_dir: Path, workspace: Path
) -> None:
    turns = [
        tool_use("Bash", {"command": "touch /workspace/denied-marker", "description": "marker"}),
        tool_use("Write", {"file_path": "/workspace/hello.txt", "content": "hello\n"}),
        tool_use("Read", {"file_path": "/workspace/hello.txt"}),
        text("Done."),
    ]
    bridged = BridgedChannel(channel_dir, turns, asyncio.get_running_loop())
    with bridged.fake:
        sb = await engine.start(make_spec(image=agents_image, channel_dir=channel_dir))
        try:
            gate = ScriptedGate({"Bash": GateDecision(decision="deny", reason="no shell here")})
            emit = Recorder()
            ctx = host_context(sb, gate, emit, channel=bridged)  # type: ignore[arg-type]
            outcome = await ClaudeCodeRuntime().run(ctx)
        finally:
            await sb.remove()
    assert outcome.status is RunState.SUCCEEDED, (outcome, [e for e in emit.events if e[0] == "notice"])
    assert not (workspace / "denied-marker").exists()
    assert (workspace / "hello.txt").read_text() == "hello\n"
    # The managed hook asked first, for every tool (Read included), and each call was dispatched once.
    pre = [c for c in bridged.fake.hooks if c.event == "PreToolUse"]
    assert [c.body["tool_name"] for c in pre] == ["Bash", "Write", "Read"]
    assert [c[2] for c in gate.events("pre_tool_use")] == ["Bash", "Write", "Read"]
    assert {c.authorization for c in bridged.fake.hooks} == {f"Bearer {bridged.token}"}
    # The model read the reason.
    said = json.dumps(bridged.fake.messages[1]["messages"][-1])
    assert "no shell here" in said
    assert ctx.agent_version == "2.1.332"
