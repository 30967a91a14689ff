"""The policy gate: what the task core asks before a guarded action (docs/webhooks.md).

The webhooks package provides the real dispatcher; the composition root adapts it to this
protocol. `AllowAll` is the default when no policy endpoint is configured."""

import hashlib
import json
from typing import Any, Literal, Protocol

import msgspec

from forge.db.payload_base import TriggerRef
from tasks.core.transcript import System

DecisionName = Literal["allow", "deny", "ask"]
PromptKind = Literal["goal", "message", "answer", "review"]
SessionSource = Literal["start", "retry", "message", "answer", "review"]


class GateContext(msgspec.Struct, frozen=True, kw_only=True):
    """Who and what a policy question is about (becomes the hook envelope's `meta`)."""

    repository: str  # owner/name
    repo_uuid: str
    task_uuid: str
    task_number: int
    task_url: str
    run_uuid: str = ""
    run_seq: int = 0
    actor_login: str = ""
    actor_type: Literal["User", "Bot"] = "User"
    agent_login: str = ""
    parent_number: int | None = None  # a subtask's parent task
    trigger: TriggerRef | None = None  # what started the task when no person's start did


class GateDecision(msgspec.Struct, frozen=True, kw_only=True):
    decision: DecisionName = "allow"
    reason: str = ""
    # allow only: the input to use instead (`{"prompt": ...}` for prompts, the tool input for tools).
    input_override: dict[str, Any] | None = None
    model_context: str = ""  # reaches the model only
    user_message: str = ""  # reaches people only (a transcript notice)
    # A failed dispatch (fail-closed) is a deny whose reason names the delivery.
    failed: bool = False
    # An `ask` that comes from failure policy `hold` (the endpoint failed), not from a consumer.
    held: bool = False
    # The endpoint whose deny or ask decided (its URL), for the approval card.
    decided_by: str = ""
    # What the endpoints answered (event, decision, delivery id, per endpoint: url, result class,
    # decision, status, latency): recorded in the transcript so a reviewer sees why. None when no
    # endpoint was called.
    dispatch: dict[str, Any] | None = None


def policy_record(decision: GateDecision) -> "System | None":
    """The transcript `system` event (phase `policy`) of a dispatch, if one happened."""
    d = decision.dispatch
    if not d:
        return None
    parts = [
        f"{e['url']} {e['result']}" + (f" {e['decision']}" if e.get("decision") else "") + f" {e['latency_ms']:.0f} ms"
        for e in d.get("endpoints", [])
    ]
    text = f"{d['event']}: {d['decision']}" + (f" ({'; '.join(parts)})" if parts else "")
    # The reason goes along: a reader of the transcript sees why a call was denied or held.
    return System(phase="policy", text=text, detail={**d, "reason": decision.reason} if decision.reason else d)


ALLOW = GateDecision()


class PolicyGate(Protocol):
    async def session_start(
        self, ctx: GateContext, *, source: SessionSource, runtime: str, image: str
    ) -> GateDecision: ...

    async def user_prompt_submit(
        self, ctx: GateContext, *, prompt: str, kind: PromptKind, session: Any = None
    ) -> GateDecision: ...

    async def pre_tool_use(
        self, ctx: GateContext, *, tool_use_id: str, tool_name: str, tool_input: Any
    ) -> GateDecision: ...

    async def post_tool_use(
        self,
        ctx: GateContext,
        *,
        tool_use_id: str,
        tool_name: str,
        tool_response: str | None,
        tool_error: str | None,
    ) -> GateDecision: ...

    async def stop(self, ctx: GateContext, *, summary: str, turns: int, changed_files: list[str]) -> GateDecision: ...

    async def pre_merge(self, ctx: GateContext, *, merge: dict[str, Any]) -> GateDecision: ...


class AllowAll:
    """No policy endpoints: everything is allowed, nothing is added."""

    async def session_start(self, ctx: GateContext, *, source: SessionSource, runtime: str, image: str) -> GateDecision:
        return ALLOW

    async def user_prompt_submit(
        self, ctx: GateContext, *, prompt: str, kind: PromptKind, session: Any = None
    ) -> GateDecision:
        return ALLOW

    async def pre_tool_use(
        self, ctx: GateContext, *, tool_use_id: str, tool_name: str, tool_input: Any
    ) -> GateDecision:
        return ALLOW

    async def post_tool_use(
        self,
        ctx: GateContext,
        *,
        tool_use_id: str,
        tool_name: str,
        tool_response: str | None,
        tool_error: str | None,
    ) -> GateDecision:
        return ALLOW

    async def stop(self, ctx: GateContext, *, summary: str, turns: int, changed_files: list[str]) -> GateDecision:
        return ALLOW

    async def pre_merge(self, ctx: GateContext, *, merge: dict[str, Any]) -> GateDecision:
        return ALLOW


def input_hash(tool_input: Any) -> str:
    """SHA-256 of the canonical JSON of a tool input: what an approval is bound to."""
    canonical = json.dumps(tool_input, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


class ApprovalRequest(msgspec.Struct, frozen=True, kw_only=True):
    """A tool call the runtime parked for a person (policy `ask`, or failure policy `hold`)."""

    tool_use_id: str
    tool_name: str
    tool_input: dict[str, Any]
    reason: str = ""
    held: bool = False
    requested_by: str = ""
    delivery_id: str = ""


class ApprovedCall(msgspec.Struct, frozen=True, kw_only=True):
    """A person's decision on a parked call, handed to the run that resumes the task."""

    tool_use_id: str
    tool_name: str
    tool_input: dict[str, Any]
    input_hash: str
    approved: bool
    decided_by: str = ""
    reason: str = ""
