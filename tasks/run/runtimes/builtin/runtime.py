"""The `builtin` runtime: an agent loop on the host speaking OpenAI-compatible chat completions.

Its model calls go through the run's model gateway (the run token on the channel's socket; the
real key is the gateway's alone); only tool executions reach the sandbox (exec for `bash`,
host-side safe file access for the file tools). The conversation is carried from one run
to the next (an answer to `ask_user` becomes that call's tool result)."""

import json
from typing import Any

import httpx
import msgspec

from sandbox import SandboxError
from tasks.core.capping import TOOL_OUTPUT_CAP, cap_text
from tasks.core.policy import ApprovalRequest, ApprovedCall, input_hash
from tasks.core.states import FailureReason, RunKind, RunState
from tasks.core.transcript import Assistant, Notice, Question, ToolCall, ToolResult
from tasks.run.backchannel import ToolRefused
from tasks.run.runtimes.base import Outcome, RunContext, RuntimeUnavailable
from tasks.run.runtimes.builtin.conversation import pending_tool_calls, resume
from tasks.run.runtimes.builtin.model_client import TOOL_NAMES, ModelFailure, chat, tools_of
from tasks.run.runtimes.builtin.tools import ToolError, execute
from tasks.run.runtimes.policy_broker import as_call_input, custom_args, policy_view
from tasks.run.runtimes.policy_steps import StopStep, after_tool, approval_request, verify
from tasks.run.runtimes.policy_steps import decided as record_decision
from tasks.run.runtimes.policy_steps import record as _record


class _Conversation(msgspec.Struct, kw_only=True):
    """One run's conversation with the model, the summary the agent reported, its stop step."""

    messages: list[dict[str, Any]]
    stop: StopStep
    summary: str = ""


class _Turn(msgspec.Struct, kw_only=True):
    """What one turn's tool calls left: a question for the user, a call parked for approval, the
    policies' notes for the model."""

    question: str = ""
    options: list[str] = msgspec.field(default_factory=list)
    approval: ApprovalRequest | None = None
    notes: list[str] = msgspec.field(default_factory=list)  # never inside a tool result


class BuiltinRuntime:
    name = "builtin"
    model_provider = "openai"  # what its gateway calls speak (the key that pays is this provider's)

    def __init__(self, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self._transport = transport

    def needs_model(self) -> bool:
        return True

    async def run(self, ctx: RunContext) -> Outcome:
        if ctx.model is None:
            raise RuntimeUnavailable("no model endpoint is configured", FailureReason.MODEL_UNREACHABLE)
        talk = _Conversation(messages=resume(ctx), stop=StopStep(ctx))
        if ctx.kind == RunKind.APPROVAL and ctx.approval is not None:
            parked = await self._resume_approved(ctx, ctx.approval, talk.messages)
            if parked is not None:
                return parked
        transport = self._transport
        if transport is None and ctx.model.uds:
            transport = httpx.AsyncHTTPTransport(uds=ctx.model.uds)
        async with httpx.AsyncClient(transport=transport, follow_redirects=False, trust_env=False) as client:
            while True:
                outcome = await self._turn(ctx, client, talk)
                if outcome is not None:
                    return outcome

    async def _turn(self, ctx: RunContext, client: httpx.AsyncClient, talk: _Conversation) -> Outcome | None:
        """One model call and the tool calls it asks for: the run's outcome when it ends with this
        turn, None when it goes on."""
        assert ctx.model is not None
        if ctx.turns >= ctx.limits.turn_limit:
            return Outcome(
                status=RunState.FAILED,
                failure_reason=FailureReason.TURN_LIMIT,
                error=f"turn limit reached ({ctx.limits.turn_limit} turns)",
                summary=talk.summary,
                conversation=talk.messages,
            )
        try:
            answer = await chat(client, ctx.model, talk.messages, tools_of(ctx.backchannel))
        except ModelFailure as exc:
            return Outcome(
                status=RunState.FAILED, failure_reason=exc.reason, error=str(exc), conversation=talk.messages
            )
        content, calls = await self._answered(ctx, answer, talk)
        budget = ctx.limits.token_budget
        if budget and ctx.prompt_tokens + ctx.completion_tokens > budget:
            return Outcome(
                status=RunState.FAILED,
                failure_reason=FailureReason.TOKEN_BUDGET,
                error=f"token budget of {budget} exceeded",
                conversation=talk.messages,
            )
        if not calls:
            return await self._finished(talk, content)
        return await self._calls(ctx, calls, talk)

    async def _answered(self, ctx: RunContext, answer: dict[str, Any], talk: _Conversation) -> tuple[Any, list[Any]]:
        """The model's answer counted (a turn, its tokens), kept in the conversation and shown:
        its content and its tool calls."""
        ctx.turns += 1
        usage = answer["usage"]
        ctx.prompt_tokens += int(usage.get("prompt_tokens") or 0)
        ctx.completion_tokens += int(usage.get("completion_tokens") or 0)
        message = answer["message"]
        content = message.get("content") or ""
        calls = message.get("tool_calls") or []
        if not isinstance(calls, list):
            calls = []
        stored: dict[str, Any] = {"role": "assistant", "content": content if isinstance(content, str) else ""}
        if calls:
            stored["tool_calls"] = calls
        talk.messages.append(stored)
        if isinstance(content, str) and content.strip():
            await ctx.emit("assistant", Assistant(text=content))
        return content, calls

    async def _finished(self, talk: _Conversation, content: Any) -> Outcome | None:
        """The model called no tool: the agent is done, unless the stop policy gives it more to do."""
        final = talk.summary or (content.strip() if isinstance(content, str) else "")
        more = await talk.stop.next_message(final)
        if more:
            talk.messages.append({"role": "user", "content": more})
            return None
        return Outcome(status=RunState.SUCCEEDED, summary=final, conversation=talk.messages)

    async def _calls(self, ctx: RunContext, calls: list[Any], talk: _Conversation) -> Outcome | None:
        """The turn's tool calls in order. A failed policy ends the run at once; a question or a
        parked call blocks it once the turn's results are in (the calls after it are not run)."""
        ids = [str(c.get("id") or "") if isinstance(c, dict) else "" for c in calls]
        # Two calls with one id in a turn cannot be told apart by a policy consumer
        # (decisions are bound to the id): none of them runs (fail closed).
        duplicated = {i for i in ids if ids.count(i) > 1}
        turn = _Turn()
        for call, call_id in zip(calls, ids, strict=True):
            failed = await self._call(ctx, call, call_id=call_id, duplicated=duplicated, talk=talk, turn=turn)
            if failed is not None:
                return failed
        if turn.notes:
            # After every tool result of the turn (the API wants those right after the call).
            talk.messages.append({"role": "system", "content": "Policy note:\n" + "\n\n".join(turn.notes)})
        if turn.question:
            return Outcome(
                status=RunState.BLOCKED,
                question=turn.question,
                question_options=turn.options,
                summary=talk.summary,
                conversation=talk.messages,
            )
        if turn.approval is not None:
            return Outcome(
                status=RunState.BLOCKED, approval=turn.approval, summary=talk.summary, conversation=talk.messages
            )
        return None

    async def _call(
        self, ctx: RunContext, call: Any, *, call_id: str, duplicated: set[str], talk: _Conversation, turn: _Turn
    ) -> Outcome | None:
        """One tool call of the turn, its result kept in the conversation: the run's outcome when a
        failed policy ends it."""
        if turn.question or turn.approval is not None:
            waiting = "the user" if turn.question else "a person's approval of an earlier call"
            talk.messages.append(
                {"role": "tool", "tool_call_id": call_id, "content": f"not run: waiting for {waiting}"}
            )
            return None
        if call_id in duplicated:
            result = f"error: the tool call id {call_id!r} is used twice in this turn; nothing was run"
            name = str((call.get("function") or {}).get("name") or "") if isinstance(call, dict) else ""
            await ctx.emit("tool_result", ToolResult(id=call_id, name=name, output=result, is_error=True))
            talk.messages.append({"role": "tool", "tool_call_id": call_id, "content": result})
            return None
        result, _, extra = await self._tool(ctx, call)
        if extra.get("policy_failure"):
            return Outcome(
                status=RunState.FAILED,
                failure_reason=FailureReason.POLICY,
                error=extra["policy_failure"],
                conversation=talk.messages,
            )
        if extra.get("approval") is not None:
            turn.approval = extra["approval"]
            if extra.get("model_context"):
                turn.notes.append(extra["model_context"])
            return None  # the decision becomes this call's result in the approval run
        if extra.get("question"):
            turn.question, turn.options = extra["question"], list(extra.get("options") or [])
            await ctx.emit("question", Question(text=turn.question, tool_call_id=call_id, options=turn.options))
            return None  # the answer becomes this call's result in the next run
        if extra.get("summary"):
            talk.summary = extra["summary"]
        if extra.get("model_context"):
            turn.notes.append(extra["model_context"])
        talk.messages.append({"role": "tool", "tool_call_id": call_id, "content": result})
        return None

    async def _resume_approved(
        self, ctx: RunContext, decided: ApprovedCall, messages: list[dict[str, Any]]
    ) -> Outcome | None:
        """Answer the parked call with the person's decision. Approving runs exactly the approved
        input: the one stored with the approval (what the person saw), checked intact by its hash."""
        call = next((c for c in pending_tool_calls(messages) if c.get("id") == decided.tool_use_id), None)
        for other in pending_tool_calls(messages):
            if other is not call:
                messages.append(
                    {"role": "tool", "tool_call_id": other.get("id", ""), "content": "not run: the run ended"}
                )
        if call is None:
            await ctx.emit(
                "notice", Notice(text="the approved call is not pending any more; nothing was run", level="warning")
            )
            return None
        fn = call.get("function") or {}
        name = str(fn.get("name") or "")
        call_id = decided.tool_use_id
        # What runs is the input stored with the approval (what the person saw), checked intact.
        if name != decided.tool_name or input_hash(decided.tool_input) != decided.input_hash:
            text = "error: the decision does not match this call's input; it was not executed"
            await ctx.emit("tool_result", ToolResult(id=call_id, name=name, output=text, is_error=True))
            messages.append({"role": "tool", "tool_call_id": call_id, "content": text})
            return None
        if not decided.approved:
            why = decided.reason or "no reason given"
            text = (
                f"error: a person denied this {name} call; it was not executed. Do not retry it unless the user "
                f"asks; explain this to the user. Reason: {why}"
            )
            await ctx.emit("tool_result", ToolResult(id=call_id, name=name, output=text, is_error=True))
            messages.append({"role": "tool", "tool_call_id": call_id, "content": text})
            return None
        # A person's decision is this call's: the approved input runs.
        ctx.ledger.decided(call_id, decided.tool_input, allowed=True)
        result, _, extra = await self._run_tool(ctx, call_id, name, dict(decided.tool_input))
        if extra.get("question"):
            options = list(extra.get("options") or [])
            await ctx.emit("question", Question(text=extra["question"], tool_call_id=call_id, options=options))
            return Outcome(
                status=RunState.BLOCKED, question=extra["question"], question_options=options, conversation=messages
            )
        messages.append({"role": "tool", "tool_call_id": call_id, "content": result})
        if extra.get("model_context"):
            messages.append({"role": "system", "content": "Policy note:\n" + extra["model_context"]})
        return None

    async def _tool(self, ctx: RunContext, call: Any) -> tuple[str, bool, dict[str, Any]]:
        """Run one tool call; every problem goes back to the model as a tool error."""
        if not isinstance(call, dict):
            return "error: malformed tool call", True, {}
        call_id = str(call.get("id") or "")
        if len(call_id) > MAX_CALL_ID or "\x00" in call_id:
            # It names the call in the transcript, the hooks and approvals: keep it storable.
            return f"error: a tool call id must be at most {MAX_CALL_ID} characters, without NUL", True, {}
        fn = call.get("function") or {}
        name = str(fn.get("name") or "") if isinstance(fn, dict) else ""
        raw_args = fn.get("arguments", "{}") if isinstance(fn, dict) else "{}"
        try:
            args = json.loads(raw_args, parse_constant=_no_constant) if isinstance(raw_args, str) else raw_args
            if not isinstance(args, dict):
                raise ValueError("arguments must be a JSON object")
        except ValueError as exc:
            args = None
            parse_error = f"error: the arguments are not valid JSON ({exc}); send a JSON object"
        await ctx.emit("tool_call", ToolCall(id=call_id, name=name, input=args if args is not None else raw_args))
        if name not in TOOL_NAMES and not _offered(ctx, name):
            text = f"error: unknown tool {name!r}; available: {', '.join(sorted(TOOL_NAMES))}"
            await ctx.emit("tool_result", ToolResult(id=call_id, name=name, output=text, is_error=True))
            return text, True, {}
        if args is None:
            await ctx.emit("tool_result", ToolResult(id=call_id, name=name, output=parse_error, is_error=True))
            return parse_error, True, {}
        try:
            policy_name, policy_input = policy_view(ctx, name, args)
        except ToolRefused as exc:
            await ctx.emit("tool_result", ToolResult(id=call_id, name=name, output=str(exc), is_error=True))
            return str(exc), True, {}
        decision = await ctx.gate.pre_tool_use(
            ctx.gate_ctx, tool_use_id=call_id, tool_name=policy_name, tool_input=policy_input
        )
        record_decision(ctx, call_id, args, decision)
        await _record(ctx, decision)
        if decision.user_message:
            await ctx.emit("notice", Notice(text=decision.user_message))
        if decision.decision == "ask":
            # A consumer asks a person (or an endpoint with failure policy `hold` failed): the call
            # is parked as an approval and the run blocks; nothing runs until someone decides.
            # The input a person approves is the one that would run: an earlier endpoint's
            # rewrite (input_override) included, as the asking endpoint saw it.
            try:  # a rewritten custom tool call is parked as the call's own arguments
                decision = as_call_input(ctx, name, decision)
            except ToolRefused as exc:
                await ctx.emit("tool_result", ToolResult(id=call_id, name=name, output=str(exc), is_error=True))
                return str(exc), True, {}
            request = approval_request(decision, tool_use_id=call_id, tool_name=name, tool_input=args)
            return "", False, {"approval": request, "model_context": decision.model_context}
        if decision.failed:
            # Fail closed: the run stops (the tool is not run), the reason names the delivery.
            return decision.reason, True, {"policy_failure": decision.reason}
        if decision.decision != "allow":
            reason = decision.reason or "no reason given"
            text = (
                f"error: an external policy blocked this {name} call; it was not executed and retrying it will be "
                f"denied again. Explain this to the user. Reason: {reason}"
            )
            await ctx.emit("tool_result", ToolResult(id=call_id, name=name, output=text, is_error=True))
            return text, True, {"model_context": decision.model_context} if decision.model_context else {}
        if decision.input_override:
            try:  # a custom tool's rewritten inputs are checked again
                override = decision.input_override
                args = custom_args(ctx, name, override) if _is_custom(ctx, name) else override
            except ToolRefused as exc:
                await ctx.emit("tool_result", ToolResult(id=call_id, name=name, output=str(exc), is_error=True))
                return str(exc), True, {}
        return await self._run_tool(ctx, call_id, name, args, decision.model_context)

    async def _run_tool(
        self, ctx: RunContext, call_id: str, name: str, args: dict[str, Any], context: str = ""
    ) -> tuple[str, bool, dict[str, Any]]:
        """Execute an allowed call, record its result and send `post_tool_use`."""
        extra: dict[str, Any] = {}
        try:
            output = await execute(ctx, name, args, extra)
            is_error = False
        except (ToolError, SandboxError, OSError) as exc:
            output = f"error: {exc}"
            is_error = True
        if "question" in extra:
            return "", False, extra
        text, omitted = cap_text(output, TOOL_OUTPUT_CAP)
        await ctx.emit(
            "tool_result", ToolResult(id=call_id, name=name, output=text, is_error=is_error, omitted_bytes=omitted)
        )
        # The loop runs only what was decided; the ledger still sees every call (one rule for all).
        await ctx.emit_all(verify(ctx, call_id, name, args, error=is_error))
        after = await after_tool(ctx, tool_use_id=call_id, tool_name=name, output=text, is_error=is_error)
        contexts = [c for c in (context, after.model_context) if c.strip()]
        if contexts:
            extra["model_context"] = "\n\n".join(contexts)
        return text, is_error, extra


MAX_CALL_ID = 200


def _no_constant(value: str) -> Any:
    raise ValueError(f"{value} is not a JSON number")


def _is_custom(ctx: RunContext, name: str) -> bool:
    """A custom tool of the repository (or `get_tool_run`), offered to this run."""
    return ctx.backchannel is not None and ctx.backchannel.custom is not None and ctx.backchannel.custom.knows(name)


def _offered(ctx: RunContext, name: str) -> bool:
    """A tool of this run beyond the fixed ones: a custom tool, or `propose_tool` when offered."""
    proposes = name == "propose_tool" and ctx.backchannel is not None and ctx.backchannel.may_propose
    return proposes or _is_custom(ctx, name)
