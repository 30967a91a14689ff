"""The claude-code policy broker: one `pre_tool_use` per tool call whichever path asks first (the
control channel's `can_use_tool` or the managed `PreToolUse` hook), and the answers each path gets."""

import asyncio
from pathlib import Path
from typing import Any

from tasks.core.policy import GateDecision
from tasks.run.runtimes.claude.control import control_answer
from tasks.run.runtimes.policy_broker import PolicyBroker, Verdict, hook_answer
from tests.support.claude_host import HostSandbox, Recorder, ScriptedGate, host_context
from tests.support.waiting import event


class HeldGate(ScriptedGate):
    """A gate that answers only once the test releases it (after both paths have asked)."""

    def __init__(self, decisions: dict[str, GateDecision]) -> None:
        super().__init__(decisions)
        self.asked = asyncio.Event()
        self.release = asyncio.Event()

    async def pre_tool_use(self, ctx: Any, **kw: Any) -> GateDecision:
        self.asked.set()
        await self.release.wait()
        return await super().pre_tool_use(ctx, **kw)


def broker(tmp_path: Path, gate: ScriptedGate) -> tuple[PolicyBroker, list[Verdict]]:
    stops: list[Verdict] = []

    async def on_stop(v: Verdict) -> None:
        stops.append(v)

    ctx = host_context(HostSandbox(tmp_path, "http://127.0.0.1:9"), gate, Recorder())
    return PolicyBroker(ctx, on_stop), stops


async def test_the_hook_and_the_control_channel_share_one_decision(tmp_path: Path) -> None:
    gate = HeldGate({"Bash": GateDecision(decision="deny", reason="no")})
    b, _ = broker(tmp_path, gate)
    both = asyncio.gather(
        b.decide("toolu_1", "Bash", {"command": "ls"}), b.decide("toolu_1", "Bash", {"command": "ls"})
    )
    # The gate is asked by one path; the other (started in the same turn of the loop) has asked
    # the broker too by the time this wakes, so the gate answers while both wait.
    await event(gate.asked, timeout=30, what="the gate to be asked")
    gate.release.set()
    hook, control = await both
    assert hook == control and hook.behavior == "deny" and "Reason: no" in hook.message
    assert gate.events("pre_tool_use") == [("pre_tool_use", "toolu_1", "Bash")]
    # Later, the other path for the same call: the same answer, no second dispatch.
    again = await b.decide("toolu_1", "Bash", {"command": "ls"})
    assert again == hook and len(gate.events("pre_tool_use")) == 1


async def test_a_call_only_one_path_saw_is_decided_on_its_own(tmp_path: Path) -> None:
    gate = ScriptedGate()
    b, _ = broker(tmp_path, gate)
    await b.decide("toolu_a", "Read", {"file_path": "/workspace/x"})
    await b.decide("toolu_b", "Read", {"file_path": "/workspace/y"})
    assert [c[1] for c in gate.events("pre_tool_use")] == ["toolu_a", "toolu_b"]


async def test_ask_parks_the_exact_input_and_ends_the_turn(tmp_path: Path) -> None:
    gate = ScriptedGate({"Bash": GateDecision(decision="ask", reason="a person decides")})
    b, stops = broker(tmp_path, gate)
    v = await b.decide("toolu_p", "Bash", {"command": "rm -rf build"})
    assert v.behavior == "deny" and v.stop == "approval"
    assert b.parked is not None and b.parked.tool_input == {"command": "rm -rf build"}
    assert b.parked.reason == "a person decides"
    assert stops == [v]
    assert control_answer("r1", v, {})["response"]["response"]["interrupt"] is True
    # Nothing else runs once the run is ending.
    later = await b.decide("toolu_q", "Read", {"file_path": "a"})
    assert later.behavior == "deny" and len(gate.events("pre_tool_use")) == 1


async def test_answers_in_the_cli_s_shapes(tmp_path: Path) -> None:
    rewrite = {"command": "ls -la"}
    b, _ = broker(tmp_path, ScriptedGate({"Bash": GateDecision(decision="allow", input_override=rewrite)}))
    v = await b.decide("toolu_r", "Bash", {"command": "ls"})
    assert control_answer("req", v, {"command": "ls"}) == {
        "type": "control_response",
        "response": {
            "subtype": "success",
            "request_id": "req",
            "response": {"behavior": "allow", "updatedInput": rewrite},
        },
    }
    assert hook_answer("PreToolUse", v) == {
        "hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": "allow", "updatedInput": rewrite}
    }
    no = Verdict(behavior="deny", message="blocked: why")
    assert hook_answer("PreToolUse", no)["hookSpecificOutput"]["permissionDecisionReason"] == "blocked: why"


async def test_a_non_object_input_is_refused_without_dispatch(tmp_path: Path) -> None:
    gate = ScriptedGate()
    b, _ = broker(tmp_path, gate)
    v = await b.decide("toolu_s", "Bash", "ls")
    assert v.behavior == "deny" and gate.calls == []
