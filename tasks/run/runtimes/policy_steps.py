"""The policy steps every agent runtime takes around a tool call and at the end of its turn, shared
so the builtin loop and the CLI agents (claude-code, codex, acp) decide and record alike: the
transcript record of a dispatch, the approval a consumer's `ask` parks, `post_tool_use` after a
call ran, and `stop` when the agent ended its turn (`StopStep`)."""

from typing import Any

from forge.core.text import without_nul
from tasks.core.policy import ApprovalRequest, GateDecision, policy_record
from tasks.core.transcript import Kind, Notice, Payload, PolicyBypass
from tasks.run.runtimes.base import RunContext
from tasks.run.runtimes.ledger import NOT_GIVEN


async def record(ctx: RunContext, decision: GateDecision) -> None:
    """Each policy dispatch is a transcript event: a reviewer sees why a call was blocked."""
    entry = policy_record(decision)
    if entry is not None:
        await ctx.emit("system", entry)


def approval_request(decision: GateDecision, *, tool_use_id: str, tool_name: str, tool_input: Any) -> ApprovalRequest:
    """The call an `ask` parks. The input a person approves is the one that would run: an earlier
    endpoint's rewrite (input_override) included, as the asking endpoint saw it."""
    return ApprovalRequest(
        tool_use_id=tool_use_id,
        tool_name=tool_name,
        tool_input=decision.input_override or tool_input,
        reason=without_nul(decision.reason)[:4000],
        held=decision.held,
        requested_by=without_nul(decision.decided_by)[:2048],
        delivery_id=str((decision.dispatch or {}).get("delivery_id") or ""),
    )


# How the CLIs name a tool of an MCP server (`mcp__<server>__<tool>`): forgehand's is "forgehand".
BACKCHANNEL_PREFIX = "mcp__forgehand__"


def backchannel_tool(tool_name: str) -> str:
    """The back-channel tool a CLI's tool call names ("" for any other tool)."""
    return tool_name[len(BACKCHANNEL_PREFIX) :] if tool_name.startswith(BACKCHANNEL_PREFIX) else ""


def hook_name(ctx: RunContext, tool_name: str) -> str:
    """The name the hooks give a call: a custom tool's is `custom_<name>` whichever way the agent's
    CLI spells it (docs/tools.md), any other as the agent named it."""
    bare = backchannel_tool(tool_name)
    custom = ctx.backchannel.custom if ctx.backchannel is not None else None
    return bare if bare and custom is not None and custom.knows(bare) else tool_name


async def post_tool(
    ctx: RunContext, *, tool_use_id: str, tool_name: str, output: str, is_error: bool
) -> tuple[GateDecision, list[tuple[Kind, Payload]]]:
    """`post_tool_use` for a call that ran, and the events that show it (the dispatch's record,
    its user message), for the caller to store right after the call's result."""
    after = await ctx.gate.post_tool_use(
        ctx.gate_ctx,
        tool_use_id=tool_use_id,
        tool_name=hook_name(ctx, tool_name),
        tool_response=None if is_error else output,
        tool_error=output if is_error else None,
    )
    events: list[tuple[Kind, Payload]] = []
    entry = policy_record(after)
    if entry is not None:
        events.append(("system", entry))
    if after.user_message:
        events.append(("notice", Notice(text=after.user_message)))
    return after, events


async def after_tool(ctx: RunContext, *, tool_use_id: str, tool_name: str, output: str, is_error: bool) -> GateDecision:
    """`post_tool_use` for a call that ran, recorded, its user message shown."""
    after, events = await post_tool(ctx, tool_use_id=tool_use_id, tool_name=tool_name, output=output, is_error=is_error)
    for kind, payload in events:
        await ctx.emit(kind, payload)
    return after


def decided(ctx: RunContext, tool_use_id: str, tool_input: Any, decision: GateDecision) -> None:
    """The ledger's record of a `pre_tool_use` decision (the builtin loop's; the CLI agents' go
    through PolicyBroker)."""
    allowed = decision.decision == "allow" and not decision.failed
    ctx.ledger.decided(tool_use_id, tool_input, allowed=allowed, runs=decision.input_override)


def verify(
    ctx: RunContext,
    tool_use_id: str,
    tool_name: str,
    tool_input: Any = NOT_GIVEN,
    *,
    error: bool = False,
    shown: Any = NOT_GIVEN,
) -> list[tuple[Kind, Payload]]:
    """A call's result arrived: the `policy_bypass` event when it ran without an allow decision
    (the ledger trips; the supervisor ends the run), for the caller to store with the result.
    `shown`: the input the stream showed, recorded but not compared."""
    bypass = ctx.ledger.ran(tool_use_id, tool_name, tool_input, error=error, shown=shown)
    if bypass is None:
        return []
    text = f"policy bypass: the {tool_name or 'unnamed'} call {tool_use_id or '(no id)'}: {bypass.reason}"
    event = PolicyBypass(
        text=without_nul(text)[:4000],
        tool_use_id=tool_use_id,
        tool_name=tool_name,
        tool_input=bypass.tool_input,
        reason=bypass.reason,
    )
    return [("policy_bypass", event)]


class StopStep:
    """`stop` when the agent ended its turn, one rule for every runtime: the decision is recorded, and
    a consumer's `model_context` becomes the agent's next message, once a run (a later `stop` is
    still dispatched and recorded, and the run ends)."""

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx
        self.continued = False

    async def next_message(self, summary: str, *, turns: int | None = None) -> str:
        """Dispatch `stop` for a turn that ended with `summary` (`turns`: the run's turns, when the
        runtime has not counted them on the context yet): what the agent is told next, or "" when
        the run ends here."""
        ctx = self.ctx
        turns = ctx.turns if turns is None else turns
        decision = await ctx.gate.stop(ctx.gate_ctx, summary=summary, turns=turns, changed_files=[])
        await record(ctx, decision)
        if self.continued or not decision.model_context.strip():
            return ""
        self.continued = True
        return decision.model_context
