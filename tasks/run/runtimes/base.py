"""The runtime interface: what the worker hands a runtime, and what a runtime hands back.

A runtime drives one run inside a started sandbox. It reports everything through `RunContext.emit`
(transcript events, redacted and stored by the worker) and returns an `Outcome`. It never sees the
database, the repository or the sandbox's spec; later CLI-agent runtimes fit the same shape."""

from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import msgspec

from sandbox import Sandbox
from tasks.core.policy import ApprovalRequest, ApprovedCall, GateContext, PolicyGate
from tasks.core.states import FailureReason, RunKind, RunState
from tasks.core.transcript import Kind, Payload
from tasks.run.backchannel import Backchannel
from tasks.run.gateway import RunChannel
from tasks.run.runtimes.ledger import DecisionLedger

__all__ = [
    "ApprovalRequest",
    "ApprovedCall",
    "ModelEndpoint",
    "Outcome",
    "RunContext",
    "Runtime",
    "RuntimeLimits",
    "RuntimeUnavailable",
]


class RuntimeLimits(msgspec.Struct, frozen=True, kw_only=True):
    turn_limit: int = 50
    tool_timeout: float = 600.0
    token_budget: int = 0  # 0 = none
    output_cap: int = 16 * 1024 * 1024  # per command of the `command` runtime


class ModelEndpoint(msgspec.Struct, frozen=True, kw_only=True):
    """Where a host-side runtime sends its model calls: the run's gateway (`uds` its socket,
    `api_key` the run token), which holds the real key."""

    base_url: str
    model: str
    api_key: str = ""
    timeout: float = 120.0
    uds: str = ""


class Outcome(msgspec.Struct, kw_only=True):
    status: RunState  # succeeded, failed or blocked
    summary: str = ""
    error: str = ""
    failure_reason: FailureReason | None = None
    question: str = ""
    question_options: list[str] = msgspec.field(default_factory=list)  # the answers the agent offered
    # The agent reported `summary` itself (report_summary): it wins over what a runtime extracted.
    summary_reported: bool = False
    exit_code: int | None = None
    # The builtin runtime's conversation after this run (stored on the task for the next one).
    conversation: list[dict[str, Any]] | None = None
    # status "blocked" on a tool call that waits for a person's approval (not a question).
    approval: ApprovalRequest | None = None


Emit = Callable[[Kind, Payload], Awaitable[None]]
EmitMany = Callable[[Sequence[tuple[Kind, Payload]]], Awaitable[None]]


class RunContext(msgspec.Struct, kw_only=True):
    sandbox: Sandbox
    kind: RunKind
    goal: str
    prompt: str  # what this run was asked: the goal, a message, an answer
    command: str | list[str] | None
    conversation: list[dict[str, Any]]
    limits: RuntimeLimits
    gate: PolicyGate
    gate_ctx: GateContext
    emit: Emit
    # The writer's batch entry (TranscriptWriter.emit_many): events that arrived together in one
    # call (a CLI's lines read at once); None: `emit_all` emits them one by one.
    emit_many: EmitMany | None = None
    model: ModelEndpoint | None = None
    # The run's channel (model gateway, hook bridge) when the runtime needs a model.
    channel: RunChannel | None = None
    # The run's back-channel (ask_user, report_summary, record_progress, spawn_subtask).
    backchannel: Backchannel | None = None
    # An `approval` run: the decision on the parked call the run resumes with.
    approval: ApprovedCall | None = None
    # Token and turn accounting (the worker stores them on the run).
    turns: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    # CLI agents (claude-code): the task's agent session to resume ("" = none yet) and the task's
    # state directory on the host (saved sessions, raw streams); the runtime sets the session and
    # what ran (agent name, CLI version), the worker stores them on the task and the run.
    agent_session_id: str = ""
    state_dir: Path | None = None
    agent_name: str = ""
    agent_version: str = ""
    # Every decision taken and every call that ran, matched (ledger.py): a call that ran without an
    # allow decision trips it, and the run fails `policy_bypass`.
    ledger: DecisionLedger = msgspec.field(default_factory=DecisionLedger)

    async def emit_all(self, events: Sequence[tuple[Kind, Payload]]) -> None:
        """Events that arrived together (the lines a CLI printed at once), in order."""
        if not events:
            return
        if self.emit_many is not None:
            await self.emit_many(events)
            return
        for kind, payload in events:
            await self.emit(kind, payload)


class Runtime(Protocol):
    name: str

    def needs_model(self) -> bool: ...

    async def run(self, ctx: RunContext) -> Outcome: ...


class RuntimeUnavailable(Exception):
    """The runtime cannot run here (no model configured...): the run fails with this message."""

    def __init__(self, message: str, reason: FailureReason) -> None:
        super().__init__(message)
        self.reason = reason
