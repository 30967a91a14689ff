"""One run's tool-call decisions for the CLI agents (claude-code, codex, acp), whichever way a call
reaches forgehand's policy (docs/agents.md): Claude Code's control channel (`can_use_tool`,
claude/control.py), the images' managed `PreToolUse` hooks of Claude Code and Codex (`POST
/hooks/<cli>/PreToolUse` on the run's gateway socket, answered here by `hook_answer`), ACP's
`session/request_permission` (acp/policy.py).

Every path ends in `PolicyBroker.decide`, which dispatches `pre_tool_use` once per tool_use_id: the
first path to ask decides, the other one reuses that decision; a call only one path saw is decided
on its own. The decision is the builtin runtime's: allow (with the consumer's input rewrite), deny
with the reason told to the model, `ask` parks an `ApprovalRequest` bound to the exact input (the
call is refused and the run ends `blocked`), a failed dispatch fails the run closed."""

import asyncio
import hashlib
import json
from collections.abc import Callable, Coroutine
from typing import Any, Literal

import msgspec

from tasks.core.policy import ApprovalRequest, ApprovedCall, GateDecision, input_hash
from tasks.core.states import FailureReason, RunState
from tasks.core.transcript import Notice, Question
from tasks.run.backchannel import ToolRefused
from tasks.run.runtimes.base import Outcome, RunContext
from tasks.run.runtimes.policy_steps import approval_request, backchannel_tool, record

Behavior = Literal["allow", "deny"]


class Verdict(msgspec.Struct, frozen=True, kw_only=True):
    behavior: Behavior
    updated_input: dict[str, Any] | None = None
    message: str = ""  # what the model is told on deny
    # The run ends after this call: parked for approval, or the policy failed closed.
    stop: Literal["", "approval", "policy_failure", "question"] = ""
    approval: ApprovalRequest | None = None


def input_hash_of(tool_input: Any) -> str:
    """A tool input's identity for the broker (any JSON value; canonical, so key order is moot)."""
    return hashlib.sha256(json.dumps(tool_input, sort_keys=True, default=str).encode()).hexdigest()


# How a runtime ends its agent's turn when a decision ends the run (a parked call, a question, a
# failed policy): Claude Code's control-channel interrupt, ACP's `session/cancel`; Codex has none.
StopHook = Callable[[Verdict], Coroutine[Any, Any, None]]
QUESTION_STOP = Verdict(behavior="deny", stop="question")

# The answer to a second ask under a decided id with another input (see PolicyBroker.decide).
NOT_DECIDED = Verdict(
    behavior="deny", message="error: this call's input is not the one policy decided; nothing was run"
)


class PolicyBroker:
    """One run's tool-call decisions, keyed by tool_use_id, and those under way in the background."""

    def __init__(self, ctx: RunContext, on_stop: StopHook | None = None) -> None:
        self.ctx = ctx
        self._decided: dict[str, asyncio.Future[Verdict]] = {}
        self._inputs: dict[str, tuple[str, ...]] = {}  # tool_use_id -> the decided input (and its rewrite)
        self._on_stop = on_stop
        self.dispatched = 0  # pre_tool_use dispatches (one per tool_use_id)
        self.parked: ApprovalRequest | None = None
        self.question = ""  # the agent asked the user (AskUserQuestion, ask_user): the run blocks on it
        self.question_options: list[str] = []
        self.question_call = ""  # the AskUserQuestion call that asked ("": the back-channel's ask_user)
        self.policy_failure = ""
        self.denied: set[str] = set()
        # Calls this broker let run: only those get a post_tool_use (an agent's hook call naming an id
        # that never passed pre_tool_use is not a tool call that happened).
        self.allowed: set[str] = set()
        self.approved_pending: ApprovedCall | None = (
            ctx.approval if ctx.approval is not None and ctx.approval.approved else None
        )
        # Decisions taken in the background while the agent's output is read on (`spawn`).
        self.tasks: set[asyncio.Task[None]] = set()

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Take a decision (or end a turn) in the background; `tasks` holds it until it is done."""
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def cancel_tasks(self) -> None:
        for task in list(self.tasks):
            task.cancel()

    async def on_question(self, text: str, options: list[str]) -> None:
        """The back-channel's ask_user (the run's question hook): the run blocks on the question and
        later calls are refused; the turn ends the runtime's way (`on_stop`) in the background, so
        that the ask_user call itself is answered first."""
        if self.question:
            return
        self.question, self.question_options = text, options
        if self._on_stop is not None:
            self.spawn(self._on_stop(QUESTION_STOP))

    def was_decided(self, tool_use_id: str) -> bool:
        return tool_use_id in self._decided

    @property
    def ending(self) -> bool:
        """A decision ended the run (parked, failed policy, a question) or a call bypassed policy."""
        return self.parked is not None or bool(self.policy_failure or self.question) or self.ctx.ledger.tripped.is_set()

    async def ended(self, exit_code: int | None = None) -> Outcome | None:
        """How the run ends when a decision ended it (a failed policy, a parked call, a question for
        the person; the question is recorded), or None: the agent's own ending decides."""
        if self.policy_failure:
            return Outcome(
                status=RunState.FAILED, failure_reason=FailureReason.POLICY, error=self.policy_failure,
                exit_code=exit_code,
            )  # fmt: skip
        if self.parked is not None:
            return Outcome(status=RunState.BLOCKED, approval=self.parked, exit_code=exit_code)
        if self.question:
            options = self.question_options
            question = Question(text=self.question, options=options, tool_call_id=self.question_call)
            await self.ctx.emit("question", question)
            return Outcome(
                status=RunState.BLOCKED, question=self.question, question_options=options, exit_code=exit_code
            )
        return None

    async def decide(self, tool_use_id: str, tool_name: str, tool_input: Any) -> Verdict:
        known = self._decided.get(tool_use_id) if tool_use_id else None
        if known is not None:
            verdict = await asyncio.shield(known)
            # One decision per call: a second ask under the same id (the other policy layer) gets
            # it only for the input that was decided (or the policy's rewrite of it). Another
            # input under a decided id was never put to the policy, and never runs.
            inputs = self._inputs.get(tool_use_id, ())
            if input_hash_of(tool_input) not in inputs:
                return NOT_DECIDED
            return verdict
        future: asyncio.Future[Verdict] = asyncio.get_running_loop().create_future()
        if tool_use_id:
            self._decided[tool_use_id] = future
            self._inputs[tool_use_id] = (input_hash_of(tool_input),)
        try:
            verdict = await self._decide(tool_use_id, tool_name, tool_input)
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: a reuser gets it, nobody logs it twice
            raise
        future.set_result(verdict)
        self.ctx.ledger.decided(
            tool_use_id, tool_input, allowed=verdict.behavior == "allow", runs=verdict.updated_input
        )
        if tool_use_id and verdict.updated_input is not None:
            self._inputs[tool_use_id] += (input_hash_of(verdict.updated_input),)
        if verdict.behavior == "deny":
            self.denied.add(tool_use_id)
        elif tool_use_id:
            self.allowed.add(tool_use_id)
        if verdict.behavior == "allow" and self.ctx.backchannel is not None:
            tool = backchannel_tool(tool_name)
            if tool:  # the CLI is about to call forgehand's MCP server with exactly this input
                self.ctx.backchannel.grant(
                    tool, verdict.updated_input if verdict.updated_input is not None else tool_input
                )
        if verdict.stop and self._on_stop is not None:
            await self._on_stop(verdict)
        return verdict

    async def _decide(self, tool_use_id: str, tool_name: str, tool_input: Any) -> Verdict:
        ctx = self.ctx
        if self.parked is not None or self.policy_failure or self.question:
            return Verdict(behavior="deny", message="not run: the run is ending (waiting for a person's decision)")
        if ctx.ledger.tripped.is_set():
            return Verdict(behavior="deny", message="not run: the run is ending (a tool call ran without a decision)")
        if not isinstance(tool_input, dict):
            return Verdict(behavior="deny", message="error: the tool input is not a JSON object; nothing was run")
        approved = self.approved_pending
        if approved is not None and tool_name == approved.tool_name and input_hash(tool_input) == approved.input_hash:
            # The person approved exactly this input: it runs as stored, once, without asking again.
            self.approved_pending = None
            who = f" by {approved.decided_by}" if approved.decided_by else ""
            await ctx.emit("notice", Notice(text=f"the {tool_name} call approved{who} runs now"))
            return Verdict(behavior="allow", updated_input=dict(approved.tool_input))
        try:
            policy_name, policy_input = policy_view(ctx, tool_name, tool_input)
        except ToolRefused as exc:
            return Verdict(behavior="deny", message=str(exc))
        self.dispatched += 1
        decision = await ctx.gate.pre_tool_use(
            ctx.gate_ctx, tool_use_id=tool_use_id, tool_name=policy_name, tool_input=policy_input
        )
        await record(ctx, decision)
        if decision.user_message:
            await ctx.emit("notice", Notice(text=decision.user_message))
        if decision.decision == "ask":
            try:  # a rewritten custom tool call is parked as the call's own arguments
                decision = as_call_input(ctx, tool_name, decision) if policy_name != tool_name else decision
            except ToolRefused as exc:
                return Verdict(behavior="deny", message=str(exc))
            request = approval_request(decision, tool_use_id=tool_use_id, tool_name=tool_name, tool_input=tool_input)
            self.parked = request
            text = (
                f"not run yet: this {tool_name} call waits for a person's approval. Stop here; the session "
                "continues once someone decides."
            )
            return Verdict(behavior="deny", message=text, stop="approval", approval=request)
        if decision.failed:
            self.policy_failure = decision.reason
            return Verdict(behavior="deny", message=f"error: {decision.reason}", stop="policy_failure")
        if decision.decision != "allow":
            reason = decision.reason or "no reason given"
            text = (
                f"error: an external policy blocked this {tool_name} call; it was not executed and retrying it "
                f"will be denied again. Explain this to the user. Reason: {reason}"
            )
            if decision.model_context.strip():
                text += f"\n\nPolicy note: {decision.model_context}"
            return Verdict(behavior="deny", message=text)
        if tool_name == QUESTION_TOOL:
            # The person answers in forgehand (an `answer` run resumes the session with it).
            asked = decision.input_override or tool_input
            self.question = question_text(asked) or "The agent has a question."
            self.question_options = question_options(asked)
            self.question_call = tool_use_id
            text = "The question was sent to the user. Stop here; their answer comes as the next message."
            return Verdict(behavior="deny", message=text, stop="question")
        if decision.input_override and policy_name != tool_name:
            try:  # a policy's rewrite of a custom tool's call: its inputs, checked again
                return Verdict(behavior="allow", updated_input=custom_args(ctx, tool_name, decision.input_override))
            except ToolRefused as exc:
                return Verdict(behavior="deny", message=str(exc))
        return Verdict(behavior="allow", updated_input=decision.input_override or tool_input)


QUESTION_TOOL = "AskUserQuestion"


def policy_view(ctx: RunContext, tool_name: str, tool_input: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """What `pre_tool_use` sees of a call: a custom tool's as `custom_<name>` with its version and
    validated inputs (an invalid call is refused before any policy sees it), any other as it came."""
    custom = ctx.backchannel.custom if ctx.backchannel is not None else None
    name = backchannel_tool(tool_name) or tool_name
    if custom is None or not custom.knows(name):
        return tool_name, tool_input
    return name, custom.policy_form(name, tool_input)


def as_call_input(ctx: RunContext, tool_name: str, decision: GateDecision) -> GateDecision:
    """A policy's rewrite of a custom tool's call (`{"version", "inputs"}`) as the call's own
    arguments, checked again: what a person approves is what the agent's call will carry."""
    if not decision.input_override or not _custom_name(ctx, tool_name):
        return decision
    return msgspec.structs.replace(decision, input_override=custom_args(ctx, tool_name, decision.input_override))


def _custom_name(ctx: RunContext, tool_name: str) -> bool:
    custom = ctx.backchannel.custom if ctx.backchannel is not None else None
    return custom is not None and custom.knows(backchannel_tool(tool_name) or tool_name)


def custom_args(ctx: RunContext, tool_name: str, override: Any) -> dict[str, Any]:
    assert ctx.backchannel is not None and ctx.backchannel.custom is not None
    return ctx.backchannel.custom.from_policy_form(backchannel_tool(tool_name) or tool_name, override)


def question_text(tool_input: dict[str, Any]) -> str:
    """AskUserQuestion's input: `{"questions": [{"question", "header", "options": [{"label", ...}]}]}`."""
    parts: list[str] = []
    questions = tool_input.get("questions")
    for q in questions if isinstance(questions, list) else []:
        if not isinstance(q, dict) or not isinstance(q.get("question"), str):
            continue
        labels = [str(o.get("label")) for o in q.get("options") or [] if isinstance(o, dict) and o.get("label")]
        parts.append(q["question"] + (f" (options: {', '.join(labels)})" if labels else ""))
    return "\n".join(parts)[:4000]


def question_options(tool_input: dict[str, Any]) -> list[str]:
    """The option labels of a single AskUserQuestion question (several questions: free text)."""
    questions = tool_input.get("questions")
    if not isinstance(questions, list) or len(questions) != 1 or not isinstance(questions[0], dict):
        return []
    options = questions[0].get("options")
    labels = [str(o["label"])[:200] for o in options or [] if isinstance(o, dict) and o.get("label")]
    return list(dict.fromkeys(labels))[:10]


def hook_answer(event: str, verdict: Verdict) -> dict[str, Any]:
    """The JSON the managed `PreToolUse` hook prints for a verdict."""
    out: dict[str, Any] = {"hookEventName": event, "permissionDecision": verdict.behavior}
    if verdict.behavior == "allow":
        if verdict.updated_input is not None:
            out["updatedInput"] = verdict.updated_input
    else:
        out["permissionDecisionReason"] = verdict.message
    return {"hookSpecificOutput": out}


def hook_refusal(event: str, reason: str) -> dict[str, Any]:
    if event == "PreToolUse":
        return {
            "hookSpecificOutput": {
                "hookEventName": event,
                "permissionDecision": "deny",
                "permissionDecisionReason": reason,
            }
        }
    return {"decision": "block", "reason": reason}


# How Claude Code answers a call it refused itself before any hook or permission prompt (an unknown
# tool, an input its schema rejects): the call never ran.
CLI_REFUSAL = "<tool_use_error>"


def refused_before_deciding(output: str, is_error: bool) -> bool:
    return is_error and output.lstrip().startswith(CLI_REFUSAL)
