"""The acp runtime's two policy paths for one agent: the adapter's `session/request_permission`
and the managed hooks of the CLI under it (here Codex's, as for the shipped `codex-acp`), against
a scripted ACP agent on the host. A call both paths see is dispatched once; a call only the hook
sees is still decided (and, refused, shown in the transcript); another CLI's hooks are refused."""

import asyncio
import json
from pathlib import Path
from typing import Any

from tasks.core.agent_registry import AcpAgent
from tasks.core.policy import GateDecision
from tasks.core.states import RunState
from tasks.run.runtimes.acp.runtime import AcpAgentRuntime
from tests.support.acp_agent import argv, ask, say, tool_call
from tests.support.claude_host import HostSandbox, Recorder, ScriptedGate, StubChannel, host_context
from tests.support.waiting import until

MARKER = "touch marker"
WIPE = "rm -rf /workspace"


def hook_body(call_id: str, command: str, **extra: Any) -> dict[str, Any]:
    return {"tool_name": "Bash", "tool_input": {"command": command}, "tool_use_id": call_id, **extra}


async def test_a_call_seen_by_the_hook_and_a_permission_request_is_decided_once_and_a_hook_only_call_is_gated(
    tmp_path: Path,
) -> None:
    log = tmp_path / "agent.jsonl"
    go_ahead = tmp_path / "hooks-done"
    # The agent waits until the hooks came in (as Codex's do before the adapter reports the call),
    # then asks permission for the call the hook already decided.
    startup = {"sessionUpdate": "tool_call", "toolCallId": "mcp_startup.forgehand.1", "title": "MCP startup",
               "kind": "other", "status": "completed"}  # fmt: skip
    turns = [[{"update": startup}, {"wait_file": str(go_ahead)}, ask("call-1", MARKER), say("done")]]
    agent = AcpAgent(name="scripted", command=argv({"turns": turns, "log": str(log)}), provider="none", hooks="codex")
    runtime = AcpAgentRuntime(agent, idle_seconds=20)
    sandbox = HostSandbox(tmp_path, base_url="")
    gate = ScriptedGate()

    async def pre(ctx: Any, *, tool_use_id: str, tool_name: str, tool_input: Any) -> GateDecision:
        gate.calls.append(("pre_tool_use", tool_use_id, tool_name))
        return GateDecision(decision="deny", reason="no wiping") if WIPE in str(tool_input) else GateDecision()

    gate.pre_tool_use = pre  # type: ignore[method-assign]
    channel = StubChannel()
    emit = Recorder()
    ctx = host_context(sandbox, gate, emit, channel=channel, state_dir=tmp_path / "state")
    task = asyncio.ensure_future(runtime.run(ctx))
    await until(
        lambda: channel.hook is not None and log.exists() and "session/prompt" in log.read_text(),
        timeout=30,
        what="the agent to be prompted",
    )
    assert channel.hook is not None
    allowed = await channel.hook("codex", "PreToolUse", hook_body("call-1", MARKER))
    refused = await channel.hook("codex", "PreToolUse", hook_body("call-2", WIPE))
    other = await channel.hook("claude", "PreToolUse", hook_body("call-3", "true"))
    # The decided id asked again with another input: that input was never put to the policy.
    again = await channel.hook("codex", "PreToolUse", hook_body("call-1", WIPE))
    go_ahead.touch()
    outcome = await asyncio.wait_for(task, 60)
    assert outcome.status is RunState.SUCCEEDED, outcome
    assert allowed["hookSpecificOutput"]["permissionDecision"] == "allow"
    assert refused["hookSpecificOutput"]["permissionDecision"] == "deny"
    assert "no wiping" in refused["hookSpecificOutput"]["permissionDecisionReason"]
    assert other["hookSpecificOutput"]["permissionDecision"] == "deny"  # not this run's CLI
    assert again["hookSpecificOutput"]["permissionDecision"] == "deny"
    assert "not the one policy decided" in again["hookSpecificOutput"]["permissionDecisionReason"]
    # One dispatch per call: the permission request for call-1 reused the hook's decision.
    assert gate.events("pre_tool_use") == [("pre_tool_use", "call-1", "Bash"), ("pre_tool_use", "call-2", "Bash")]
    [answer] = [m["answer"] for m in map(json.loads, log.read_text().splitlines()) if "answer_to" in m]
    assert answer["result"] == {"outcome": {"outcome": "selected", "optionId": "once"}}
    assert (sandbox.workspace / "marker").exists()
    # The transcript: call-1 with the hook's name and input, and the refused call-2 with its reason
    # (Codex never reports a call its hook refused).
    calls = {c.id: (c.name, c.input) for c in emit.of("tool_call") if c.id != "mcp_startup.forgehand.1"}
    assert calls == {"call-1": ("Bash", {"command": MARKER}), "call-2": ("Bash", {"command": WIPE})}
    results = {r.id: r for r in emit.of("tool_result")}
    assert not results["call-1"].is_error
    assert results["call-2"].is_error and "no wiping" in results["call-2"].output
    # post_tool_use once for the call that ran (the adapter's result and Codex's PostToolUse both
    # report it), none for the refused one nor for what no hook saw (the adapter's MCP startup).
    assert await channel.hook("codex", "PostToolUse", {**hook_body("call-1", MARKER), "tool_response": ""}) == {}
    assert await channel.hook("codex", "PostToolUse", {**hook_body("call-2", WIPE), "tool_response": ""}) == {}
    assert [c[1] for c in gate.events("post_tool_use")] == ["call-1"]


async def test_under_an_adapter_of_claude_a_hook_call_for_an_id_it_never_reported_asks_no_policy(
    tmp_path: Path,
) -> None:
    """claude-agent-acp reports a call (`tool_call`) as the model names it, before the CLI under it
    runs the call's hooks: a `PreToolUse` for an id the adapter never reported was forged inside the
    sandbox and is denied after the announcement wait, with no policy asked; the reported one is
    decided as usual."""
    go_ahead = tmp_path / "hooks-done"
    reported = {**tool_call("call-reported", MARKER, title="Bash"), "status": "pending"}
    turns = [[{"update": reported}, {"wait_file": str(go_ahead)}, say("done")]]
    agent = AcpAgent(name="scripted", command=argv({"turns": turns}), provider="none", hooks="claude")
    runtime = AcpAgentRuntime(agent, idle_seconds=20, announce_wait=0.5)
    gate = ScriptedGate()
    channel = StubChannel()
    ctx = host_context(HostSandbox(tmp_path, base_url=""), gate, Recorder(), channel=channel)
    task = asyncio.ensure_future(runtime.run(ctx))
    await until(lambda: ctx.ledger.was_announced("call-reported"), timeout=30, what="the adapter to report the call")
    assert channel.hook is not None
    forged = await channel.hook("claude", "PreToolUse", hook_body("call-forged", WIPE))
    decided = await channel.hook("claude", "PreToolUse", hook_body("call-reported", MARKER))
    go_ahead.touch()
    assert (await asyncio.wait_for(task, 60)).status is RunState.SUCCEEDED
    assert forged["hookSpecificOutput"]["permissionDecision"] == "deny"
    assert "no such tool call was announced" in forged["hookSpecificOutput"]["permissionDecisionReason"]
    assert decided["hookSpecificOutput"]["permissionDecision"] == "allow"
    assert gate.events("pre_tool_use") == [("pre_tool_use", "call-reported", "Bash")]


async def test_an_agent_without_managed_hooks_refuses_every_hook_call(tmp_path: Path) -> None:
    go_ahead = tmp_path / "hooks-done"  # the agent runs until the hook calls were made
    turns = [[{"wait_file": str(go_ahead)}, say("ok")]]
    agent = AcpAgent(name="plain", command=argv({"turns": turns}), provider="none", hooks="")
    channel = StubChannel()
    ctx = host_context(HostSandbox(tmp_path, base_url=""), ScriptedGate(), Recorder(), channel=channel)
    task = asyncio.ensure_future(AcpAgentRuntime(agent, idle_seconds=20).run(ctx))
    await until(lambda: channel.hook is not None, timeout=30, what="the run to open its hook channel")
    assert channel.hook is not None
    for cli in ("claude", "codex"):
        answer = await channel.hook(cli, "PreToolUse", hook_body("call-x", "true"))
        assert answer["hookSpecificOutput"]["permissionDecision"] == "deny"
    go_ahead.touch()
    assert (await asyncio.wait_for(task, 60)).status is RunState.SUCCEEDED


async def test_a_call_the_adapter_reports_run_without_any_decision_fails_the_run_policy_bypass(tmp_path: Path) -> None:
    """Under an adapter whose CLI passes the image's managed hooks, every call of the agent's is
    decided; one the adapter reports completed that no hook nor permission request ever showed
    (a hook that answered without asking forgehand) trips the run's ledger. A call decided by its
    permission request, the adapter's MCP startup and a refused call are no bypass."""
    startup = {"sessionUpdate": "tool_call", "toolCallId": "mcp_startup.forgehand.1", "title": "MCP startup",
               "kind": "other", "status": "completed"}  # fmt: skip
    unchecked = {**tool_call("call-unchecked", "touch bypassed"), "status": "completed",
                 "content": [{"type": "content", "content": {"type": "text", "text": ""}}]}  # fmt: skip
    turns = [[{"update": startup}, ask("call-asked", MARKER), {"update": unchecked}, say("done")]]
    agent = AcpAgent(
        name="scripted", command=argv({"turns": turns}), provider="none", hooks="codex",
        layers=("permission_requests", "managed_hooks"),
    )  # fmt: skip
    ctx = host_context(HostSandbox(tmp_path, base_url=""), ScriptedGate(), Recorder(), channel=StubChannel())
    emit = ctx.emit
    assert isinstance(emit, Recorder)
    await asyncio.wait_for(AcpAgentRuntime(agent, idle_seconds=20).run(ctx), 60)
    assert ctx.ledger.tripped.is_set()
    assert [(b.tool_use_id, b.tool_name) for b in ctx.ledger.bypasses] == [("call-unchecked", "`touch bypassed`")]
    [event] = emit.of("policy_bypass")
    assert event.tool_use_id == "call-unchecked" and "without a policy decision" in event.reason


async def test_the_same_calls_under_an_agent_without_managed_hooks_are_not_verified(tmp_path: Path) -> None:
    """An operator's agent reaches policy only through its permission requests (docs/agents.md):
    what it runs without asking is outside policy by design, not a bypass."""
    unchecked = {**tool_call("call-read", "cat README"), "status": "completed"}
    agent = AcpAgent(name="plain", command=argv({"turns": [[{"update": unchecked}, say("ok")]]}), provider="none")
    ctx = host_context(HostSandbox(tmp_path, base_url=""), ScriptedGate(), Recorder(), channel=StubChannel())
    outcome = await asyncio.wait_for(AcpAgentRuntime(agent, idle_seconds=20).run(ctx), 60)
    assert outcome.status is RunState.SUCCEEDED and not ctx.ledger.tripped.is_set()
