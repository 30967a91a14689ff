"""Claude Code's two policy paths (docs/agents.md, "Claude Code: how policy is enforced"), and the
control channel's lines:

- the control channel: `{"type":"control_request","request_id","request":{"subtype":"can_use_tool",
  "tool_name","input","tool_use_id","permission_suggestions",...}}` on the CLI's stdout, answered on
  its stdin with `{"type":"control_response","response":{"subtype":"success","request_id",
  "response":{"behavior":"allow","updatedInput":{...}} | {"behavior":"deny","message":...,
  "interrupt":bool}}}`;
- the managed `PreToolUse` hook (the image's `/etc/claude-code/managed-settings.json`), reaching the
  run's gateway socket as `POST /hooks/claude/PreToolUse` with `{session_id, cwd, hook_event_name,
  tool_name, tool_input, tool_use_id, ...}`, answered with `{"hookSpecificOutput":{"hookEventName":
  "PreToolUse","permissionDecision":"allow"|"deny","permissionDecisionReason","updatedInput"}}`.

Measured with 2.1.332: the hook runs first; a hook `allow` (its `updatedInput` is what runs) or
`deny` (the model sees `PreToolUse:<tool> hook error: <reason>`) settles the call and no
`can_use_tool` follows; a hook that answers no decision leaves it to `can_use_tool`. Read-only
tools (Read, Glob, Grep) never reach `can_use_tool` in the default mode: the hook is their gate.

Both paths end in `PolicyBroker.decide` (policy_broker.py): one `pre_tool_use` dispatch per
tool_use_id, the first path to ask decides and the other reuses the decision."""

from typing import Any

from tasks.run.runtimes.policy_broker import Verdict


def control_answer(request_id: str, verdict: Verdict, original: Any) -> dict[str, Any]:
    """The `control_response` line for a `can_use_tool` request."""
    if verdict.behavior == "allow":
        body: dict[str, Any] = {
            "behavior": "allow",
            "updatedInput": verdict.updated_input if verdict.updated_input is not None else original,
        }
    else:
        body = {"behavior": "deny", "message": verdict.message, "interrupt": bool(verdict.stop)}
    return {"type": "control_response", "response": {"subtype": "success", "request_id": request_id, "response": body}}


def control_error(request_id: str, message: str) -> dict[str, Any]:
    return {"type": "control_response", "response": {"subtype": "error", "request_id": request_id, "error": message}}


def interrupt_request(request_id: str) -> dict[str, Any]:
    return {"type": "control_request", "request_id": request_id, "request": {"subtype": "interrupt"}}
