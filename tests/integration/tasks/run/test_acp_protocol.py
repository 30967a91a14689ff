"""The acp runtime against a scripted ACP agent (tests/support/acp_agent.py) running as a real
process on the host, behind the `Sandbox.spawn` shape: the protocol's edge cases, each decided
safely and none crashing the run. The docker tests run the same agent inside the sandbox."""

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from tasks.core.agent_registry import AcpAgent
from tasks.core.policy import GateDecision
from tasks.core.states import FailureReason, RunState
from tasks.run.runtimes.acp.runtime import AcpAgentRuntime
from tasks.run.runtimes.base import Outcome
from tests.support.acp_agent import OPTIONS, argv, ask, say, tool_call
from tests.support.claude_host import HostSandbox, Recorder, ScriptedGate, host_context
from tests.support.waiting import until


class World:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.sandbox = HostSandbox(root, base_url="")
        self.log = root / "agent.jsonl"
        self.state = root / "state"

    def runtime(self, turns: list[list[dict[str, Any]]], **scenario: Any) -> AcpAgentRuntime:
        command = argv({"turns": turns, "log": str(self.log), **scenario})
        agent = AcpAgent(name="scripted", command=command, provider="none", session_paths=(".scripted-acp",))
        return AcpAgentRuntime(agent, idle_seconds=20)

    def received(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]

    def answers(self) -> list[dict[str, Any]]:
        return [m["answer"] for m in self.received() if "answer_to" in m]


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path)


async def run(world: World, runtime: AcpAgentRuntime, gate: ScriptedGate, **kw: Any) -> tuple[Outcome, Recorder]:
    emit = Recorder()
    ctx = host_context(world.sandbox, gate, emit, state_dir=world.state, **kw)
    outcome = await asyncio.wait_for(runtime.run(ctx), 60)
    return outcome, emit


MARKER = "touch marker"


async def test_allow_picks_the_allow_once_option_whatever_its_position_and_the_call_runs(world: World) -> None:
    turns = [[{"update": tool_call("call-1", MARKER)}, ask("call-1", MARKER), say("made "), say("the marker")]]
    gate = ScriptedGate()
    outcome, emit = await run(world, world.runtime(turns), gate)
    assert outcome.status is RunState.SUCCEEDED, outcome
    assert outcome.summary == "made the marker"
    assert (world.sandbox.workspace / "marker").exists()
    [answer] = world.answers()
    assert answer["result"] == {"outcome": {"outcome": "selected", "optionId": "once"}}
    # pre_tool_use carried the tool's name and the exact rawInput; post_tool_use followed.
    assert gate.events("pre_tool_use") == [("pre_tool_use", "call-1", f"`{MARKER}`")]
    assert gate.inputs == [{"command": MARKER}]
    assert gate.events("post_tool_use") == [("post_tool_use", "call-1", f"`{MARKER}`")]
    [call] = emit.of("tool_call")
    assert (call.id, call.kind, call.input) == ("call-1", "execute", {"command": MARKER})
    [result] = emit.of("tool_result")
    assert (result.id, result.is_error) == ("call-1", False)
    assert [a.text for a in emit.of("assistant")] == ["made the marker"]


async def test_a_deny_picks_reject_once_and_the_call_does_not_run(world: World) -> None:
    turns = [[ask("call-d", MARKER), say("refused")]]
    gate = ScriptedGate({f"`{MARKER}`": GateDecision(decision="deny", reason="no marker")})
    outcome, emit = await run(world, world.runtime(turns), gate)
    assert outcome.status is RunState.SUCCEEDED
    assert not (world.sandbox.workspace / "marker").exists()
    assert world.answers()[0]["result"] == {"outcome": {"outcome": "selected", "optionId": "no"}}
    assert gate.events("post_tool_use") == []  # it never ran
    [result] = emit.of("tool_result")
    assert result.is_error


async def test_an_allow_that_rewrites_the_input_is_refused_as_acp_cannot_carry_it(world: World) -> None:
    """A consumer's rewrite would be lost (ACP answers with an option, not an input): allowing the
    call would run the agent's original input, so it is refused."""
    turns = [[ask("call-r", MARKER), say("refused")]]
    rewrite = GateDecision(decision="allow", input_override={"command": "true"})
    gate = ScriptedGate({f"`{MARKER}`": rewrite})
    outcome, emit = await run(world, world.runtime(turns), gate)
    assert outcome.status is RunState.SUCCEEDED
    assert not (world.sandbox.workspace / "marker").exists()
    assert world.answers()[0]["result"] == {"outcome": {"outcome": "selected", "optionId": "no"}}
    assert any("rewrote the input" in n.text for n in emit.of("notice"))


@pytest.mark.parametrize(
    ("options", "note"),
    [
        ([{"optionId": "always", "name": "Always", "kind": "allow_always"}], "no allow_once option (allow_always)"),
        ([], "no allow_once option (none)"),
        ([{"optionId": "weird", "name": "Maybe", "kind": "allow_sometimes"}], "unknown option kinds ignored"),
    ],
    ids=["only-allow-always", "no-options", "unknown-kind"],
)
async def test_an_allowed_call_without_an_allow_once_option_is_refused(
    world: World, options: list[dict[str, str]], note: str
) -> None:
    turns = [[ask("call-x", MARKER, options), say("ok")]]
    gate = ScriptedGate()
    outcome, emit = await run(world, world.runtime(turns), gate)
    assert outcome.status is RunState.SUCCEEDED
    assert not (world.sandbox.workspace / "marker").exists()
    assert world.answers()[0]["result"] == {"outcome": {"outcome": "cancelled"}}
    assert any(note in n.text for n in emit.of("notice")), [n.text for n in emit.of("notice")]
    assert gate.events("post_tool_use") == []


async def test_an_unknown_option_kind_beside_allow_once_is_ignored(world: World) -> None:
    options = [{"optionId": "odd", "name": "Odd", "kind": "allow_forever"}, *OPTIONS]
    outcome, emit = await run(world, world.runtime([[ask("call-u", MARKER, options)]]), ScriptedGate())
    assert outcome.status is RunState.SUCCEEDED
    assert world.answers()[0]["result"]["outcome"]["optionId"] == "once"
    assert any("allow_forever" in n.text for n in emit.of("notice"))


async def test_a_reused_request_id_gets_one_decision_and_an_error(world: World) -> None:
    turns = [[ask("call-2", MARKER, id="same", duplicate=True), say("done")]]
    gate = ScriptedGate()
    outcome, emit = await run(world, world.runtime(turns), gate)
    assert outcome.status is RunState.SUCCEEDED
    [first] = world.answers()
    [second] = [m["answer"] for m in world.received() if "second_answer_to" in m]
    answers = [first, second]
    assert sum("result" in a for a in answers) == 1 and sum("error" in a for a in answers) == 1
    assert len(gate.events("pre_tool_use")) == 1
    assert any("reused request id" in n.text for n in emit.of("notice"))


async def test_a_call_id_asked_again_with_another_input_is_refused(world: World) -> None:
    other = "touch other-marker"
    second = ask("call-3", other)
    second["permission"]["toolCall"]["toolCallId"] = "call-3"
    turns = [[ask("call-3", "true"), second, say("done")]]
    gate = ScriptedGate()
    outcome, emit = await run(world, world.runtime(turns), gate)
    assert outcome.status is RunState.SUCCEEDED
    first, again = world.answers()
    assert first["result"]["outcome"]["optionId"] == "once"
    assert again["result"]["outcome"] == {"outcome": "selected", "optionId": "no"}
    assert not (world.sandbox.workspace / "other-marker").exists()
    assert len(gate.events("pre_tool_use")) == 1
    assert any("asked again with another input" in n.text for n in emit.of("notice"))


async def test_stray_responses_noise_and_fs_requests_do_not_crash_the_run(world: World) -> None:
    turns = [[{"stray": True}, {"noise": "not json {"}, {"fs_read": "/etc/passwd"}, say("still here")]]
    outcome, _ = await run(world, world.runtime(turns), ScriptedGate())
    assert outcome.status is RunState.SUCCEEDED and outcome.summary == "still here"
    [fs] = [m["fs_answer"] for m in world.received() if "fs_answer" in m]
    assert fs["error"]["code"] == -32601  # forgehand offers no fs capability
    init = next(m for m in world.received() if m.get("method") == "initialize")
    assert init["params"]["clientCapabilities"] == {
        "fs": {"readTextFile": False, "writeTextFile": False},
        "terminal": False,
    }


async def test_an_agent_that_exits_mid_prompt_fails_with_a_typed_reason(world: World) -> None:
    outcome, _ = await run(world, world.runtime([[say("half"), {"exit": 3}]]), ScriptedGate())
    assert outcome.status is RunState.FAILED
    assert outcome.failure_reason is FailureReason.AGENT_NO_RESULT
    assert "exiting mid-prompt" in outcome.error and outcome.exit_code == 3


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        ("Internal error: API Error: 500 scripted failure", FailureReason.MODEL_ERROR),
        ("API Error: Connection refused (ECONNREFUSED)", FailureReason.MODEL_UNREACHABLE),
        ("something else broke", FailureReason.AGENT_NO_RESULT),
        ("Internal error: Reached maximum number of turns (2)", FailureReason.TURN_LIMIT),
    ],
)
async def test_a_prompt_answered_with_an_error_fails_with_a_typed_reason(
    world: World, message: str, reason: FailureReason
) -> None:
    turns = [[say("trying"), {"fail": {"code": -32603, "message": message}}]]
    outcome, _ = await run(world, world.runtime(turns), ScriptedGate())
    assert outcome.status is RunState.FAILED and outcome.failure_reason is reason
    assert message in outcome.error


async def test_ask_parks_the_call_and_cancels_the_turn(world: World) -> None:
    turns = [[ask("call-a", MARKER), {"wait_cancel": True}]]
    gate = ScriptedGate({f"`{MARKER}`": GateDecision(decision="ask", reason="a person decides")})
    outcome, _ = await run(world, world.runtime(turns), gate)
    assert outcome.status is RunState.BLOCKED and outcome.approval is not None
    assert (outcome.approval.tool_name, outcome.approval.tool_input) == (f"`{MARKER}`", {"command": MARKER})
    assert not (world.sandbox.workspace / "marker").exists()
    # The turn is cancelled at once, so the open request is answered as ACP asks on cancel.
    assert world.answers()[0]["result"]["outcome"] == {"outcome": "cancelled"}
    assert any(m.get("method") == "session/cancel" for m in world.received())


class HangingGate(ScriptedGate):
    """A consumer that has not answered yet when the run is stopped."""

    def __init__(self) -> None:
        super().__init__()
        self.asked = asyncio.Event()

    async def pre_tool_use(self, ctx: Any, *, tool_use_id: str, tool_name: str, tool_input: Any) -> GateDecision:
        self.calls.append(("pre_tool_use", tool_use_id, tool_name))
        self.asked.set()
        await asyncio.Event().wait()  # never answers
        return GateDecision()


async def test_a_stop_cancels_the_session_and_answers_the_open_request_cancelled(world: World) -> None:
    runtime = world.runtime([[ask("call-s", MARKER)]])
    gate = HangingGate()
    ctx = host_context(world.sandbox, gate, Recorder(), state_dir=world.state)
    task = asyncio.ensure_future(runtime.run(ctx))
    await asyncio.wait_for(gate.asked.wait(), 30)
    await runtime.stopping()
    outcome = await asyncio.wait_for(task, 30)
    assert world.answers()[0]["result"] == {"outcome": {"outcome": "cancelled"}}
    assert any(m.get("method") == "session/cancel" for m in world.received())
    assert outcome.status is RunState.FAILED and outcome.failure_reason is FailureReason.INTERRUPTED
    assert not (world.sandbox.workspace / "marker").exists()


async def test_a_permission_request_after_session_cancel_is_cancelled_without_a_dispatch(world: World) -> None:
    runtime = world.runtime([[{"wait_cancel": True}, ask("call-late", MARKER)]])
    gate = ScriptedGate()
    ctx = host_context(world.sandbox, gate, Recorder(), state_dir=world.state)
    task = asyncio.ensure_future(runtime.run(ctx))
    await until(
        lambda: any(m.get("method") == "session/prompt" for m in world.received()),
        timeout=30,
        what="the agent to receive its prompt",
    )
    await runtime.stopping()
    await asyncio.wait_for(task, 30)
    assert world.answers()[0]["result"] == {"outcome": {"outcome": "cancelled"}}
    assert gate.events("pre_tool_use") == []
    assert not (world.sandbox.workspace / "marker").exists()


async def test_resume_loads_the_same_session_from_the_carried_home(world: World) -> None:
    turns = [[say("first")], [say("second")]]
    outcome, emit = await run(world, world.runtime(turns), ScriptedGate())
    assert outcome.summary == "first"
    [started] = [s for s in emit.of("system") if s.phase == "agent"]
    session = started.detail["session_id"]
    world.sandbox.fresh_home()  # a new container
    outcome, emit = await run(world, world.runtime(turns), ScriptedGate(), session=session)
    assert outcome.status is RunState.SUCCEEDED and outcome.summary == "second"
    loads = [m for m in world.received() if m.get("method") == "session/load"]
    assert [m["params"]["sessionId"] for m in loads] == [session]
    # The replayed history is not shown again.
    assert [a.text for a in emit.of("assistant")] == ["second"]


class PostRecording(ScriptedGate):
    """A consumer subscribed to post_tool_use: each dispatch leaves its record in the transcript."""

    async def post_tool_use(self, ctx: Any, *, tool_use_id: str, tool_name: str, **kw: Any) -> GateDecision:
        await super().post_tool_use(ctx, tool_use_id=tool_use_id, tool_name=tool_name, **kw)
        dispatch = {"event": "post_tool_use", "decision": "allow", "endpoints": [], "id": tool_use_id}
        return GateDecision(dispatch=dispatch)


async def test_a_busy_stream_is_stored_in_batches_each_result_followed_by_its_post_tool_use(world: World) -> None:
    """Updates read together go to the writer in one call (the run context's `emit_many`), in the
    order the agent sent them, and a call's post_tool_use record follows its result, before the
    next call's text, as the builtin loop orders them."""
    calls = 300
    batches: list[list[tuple[str, Any]]] = []

    async def emit_many(events: Any) -> None:
        batches.append(list(events))

    emit = Recorder()
    ctx = host_context(world.sandbox, PostRecording(), emit, state_dir=world.state)
    ctx.emit_many = emit_many
    outcome = await asyncio.wait_for(world.runtime([[{"calls": calls}]]).run(ctx), 60)
    assert outcome.status is RunState.SUCCEEDED, outcome
    stored = [e for batch in batches for e in batch]
    shown = [(k, p) for k, p in stored if k != "system" or p.phase == "policy"]
    expected: list[tuple[str, Any]] = []
    for i in range(calls):
        expected += [
            ("assistant", f"step {i}"),
            ("tool_call", (f"call-{i}", "Read", "read", {"path": f"/workspace/f{i}.txt"})),
            ("tool_result", (f"call-{i}", f"line {i}\n", False)),
            ("system", f"call-{i}"),
        ]

    def view(kind: str, p: Any) -> tuple[str, Any]:
        if kind == "assistant":
            return kind, p.text
        if kind == "tool_call":
            return kind, (p.id, p.name, p.kind, p.input)
        if kind == "tool_result":
            return kind, (p.id, p.output, p.is_error)
        return kind, p.detail["id"]

    assert [view(k, p) for k, p in shown] == expected
    # Read a pipe buffer at a time: far fewer writer calls than events.
    assert len([b for b in batches if any(k == "tool_call" for k, _ in b)]) < calls / 4
