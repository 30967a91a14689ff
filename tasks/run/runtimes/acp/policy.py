"""How an ACP agent's tool calls reach forgehand's policy (docs/agents.md, "Permission requests"): the adapter's
`session/request_permission` and the managed hooks of the CLI under the adapter (Claude Code's
`/etc/claude-code/managed-settings.json`, Codex's `/etc/codex/requirements.toml`, both posting
to `/hooks/<cli>/<event>` on the run's socket). Both end in one `PolicyBroker` (policy_broker.py),
so a call that both paths see is dispatched to `pre_tool_use` once (by its tool call id: the
adapters pass the CLI's id through), and a call only one path sees is still decided.

Permission requests: the option is picked by kind (`choose_option`); an input asked about again
under the same id, an allow that rewrites the input (ACP cannot carry it), a request after
`session/cancel`, a broken gate: each refused. Hooks: the configured CLI's only (`AcpAgent.hooks`);
for Codex, which leaves a call its hook refused out of what the adapter reports, the refused call
is recorded here (a `tool_call` and an error `tool_result`), and `PostToolUse` gives the
`post_tool_use` of a call that ran."""

import asyncio
import json
from typing import Any

from tasks.core.agent_registry import AcpAgent
from tasks.core.transcript import Kind, Notice, Payload, ToolResult
from tasks.run.runtimes.acp.rpc import Incoming, Peer
from tasks.run.runtimes.acp.updates import UpdateState, choose_option
from tasks.run.runtimes.base import RunContext
from tasks.run.runtimes.ledger import ANNOUNCE_WAIT
from tasks.run.runtimes.policy_broker import (
    NOT_DECIDED,
    PolicyBroker,
    StopHook,
    Verdict,
    hook_answer,
    hook_refusal,
    refused_before_deciding,
)
from tasks.run.runtimes.policy_steps import post_tool, verify
from tasks.run.runtimes.tool_kinds import tool_kind

CANCELLED = {"outcome": "cancelled"}
# codex-acp reports its MCP server's start as a tool call `mcp_startup.<server>.<uuid>`: no action
# of the agent's.
MCP_STARTUP = "mcp_startup."


class AcpPolicy:
    """One run's policy paths; `cancelled` is set by the run once `session/cancel` went out."""

    def __init__(
        self,
        ctx: RunContext,
        agent: AcpAgent,
        updates: UpdateState,
        on_stop: StopHook,
    ) -> None:
        self.ctx = ctx
        self.agent = agent
        self.updates = updates
        self.broker = PolicyBroker(ctx, on_stop)
        self.cancelled = False
        self.open: dict[Any, asyncio.Future[None]] = {}  # permission requests not answered yet
        self.asked: dict[str, str] = {}  # tool call id -> the input asked about (canonical JSON)
        self.posted: set[str] = set()  # calls whose post_tool_use went out
        self.announce_wait = ANNOUNCE_WAIT  # a Claude hook call waits this long for its id in the updates

    async def note(self, text: str) -> None:
        await self.ctx.emit("notice", Notice(text=text[:4000], level="warning"))

    async def cancel_open(self, peer: Peer) -> None:
        """Every open permission request answered `cancelled` (a stop, a parked call)."""
        for request_id, done in list(self.open.items()):
            if not done.done():
                done.set_result(None)
                await peer.respond(request_id, {"outcome": CANCELLED})

    # --- session/request_permission -------------------------------------------------------------

    async def permission(self, peer: Peer, msg: Incoming) -> None:
        params: dict[str, Any] = msg.params if isinstance(msg.params, dict) else {}
        call: dict[str, Any] = params["toolCall"] if isinstance(params.get("toolCall"), dict) else {}
        call_id = str(call.get("toolCallId") or "")
        answered = asyncio.get_running_loop().create_future()
        self.open[msg.id] = answered

        async def answer(outcome: dict[str, Any]) -> None:
            if not answered.done():
                answered.set_result(None)
                await peer.respond(msg.id, {"outcome": outcome})

        try:
            if self.cancelled:
                self.broker.denied.add(call_id)
                await self.note(f"permission request for {call_id or 'a tool call'} after session/cancel: cancelled")
                await answer(CANCELLED)
                return
            seen = self.updates.see(call)
            for kind, payload in self.updates.show(call_id):
                await self.ctx.emit(kind, payload)
            tool_input = call.get("rawInput", seen.input)
            canonical = json.dumps(tool_input, sort_keys=True, default=str)
            if self.asked.setdefault(call_id, canonical) != canonical:
                # A decision is per call id: another input under the same id was never decided.
                self.broker.denied.add(call_id)
                await self.note(f"{seen.name} ({call_id}): asked again with another input: refused")
                await answer(choose_option(params.get("options"), False)[0])
                return
            verdict = await self.broker.decide(call_id, seen.name, tool_input)
            if answered.done():
                return  # cancelled meanwhile: answered `cancelled` already
            allow = verdict.behavior == "allow"
            if allow and verdict.updated_input is not None and verdict.updated_input != tool_input:
                # ACP cannot hand the agent another input: allowing would run the original one.
                allow = False
                why = "the policy rewrote the input, which ACP cannot carry: refused"
                await self.note(f"{seen.name} ({call_id}): {why}")
            outcome, allowed, why = choose_option(params.get("options"), allow)
            if not allowed:
                self.broker.denied.add(call_id)
            if why:
                await self.note(f"{seen.name} ({call_id}): {why}")
            await answer(outcome)
        except Exception as exc:  # a broken gate never lets the call run
            self.broker.denied.add(call_id)
            await answer(CANCELLED)
            if not isinstance(exc, asyncio.CancelledError):
                failure = f"forgehand policy error: {type(exc).__name__}"
                self.broker.policy_failure = self.broker.policy_failure or failure
        finally:
            self.open.pop(msg.id, None)

    # --- the managed hooks ----------------------------------------------------------------------

    async def on_hook(self, agent: str, event: str, body: dict[str, Any]) -> dict[str, Any]:
        """`POST /hooks/<agent>/<event>` from the image's managed hooks (the backstop)."""
        if not self.agent.hooks or agent != self.agent.hooks:
            return hook_refusal(event, f"forgehand: no {agent} hooks in this run")
        post = event == "PostToolUse" and agent == "codex"  # Claude's post_tool_use comes from the updates
        if event != "PreToolUse" and not post:
            return {}
        name, tool_input = body.get("tool_name"), body.get("tool_input")
        call_id = str(body.get("tool_use_id") or "")
        if not isinstance(name, str) or not name:
            return hook_refusal(event, "forgehand: the hook input names no tool")
        if post:
            return await self._post(call_id, name, body.get("tool_response"))
        if self.cancelled:
            return hook_refusal(event, "forgehand: the turn was cancelled")
        if agent == "claude" and not (call_id and await self.ctx.ledger.announced(call_id, self.announce_wait)):
            # Codex reports a call only after its hook allowed it: no such check can hold there
            # (the channel's rate limit and cap bound forged calls; the verify step catches a
            # call that ran undecided).
            return hook_refusal(event, "forgehand: no such tool call was announced in the agent's stream")
        again = bool(call_id) and self.broker.was_decided(call_id)
        verdict = await self.broker.decide(call_id, name, tool_input)
        if again:
            if verdict is NOT_DECIDED:  # another input under a decided id: the call shown stays
                await self.note(f"{name} ({call_id}): {verdict.message}")
        elif agent == "codex" and call_id:
            await self._codex_seen(call_id, name, tool_input, verdict)
        return hook_answer(event, verdict)

    async def _codex_seen(self, call_id: str, name: str, tool_input: Any, verdict: Verdict) -> None:
        """The transcript shows a Codex call with the hook's name and input; a refused one, which
        the adapter never reports, ends here with its reason."""
        rewrite = verdict.updated_input if verdict.behavior == "allow" else None
        runs = tool_input if rewrite is None else rewrite
        seen = self.updates.pin(call_id, name, runs, tool_kind(name))
        if verdict.behavior != "deny" or seen.done:
            return
        seen.done = True
        for kind, payload in self.updates.show(call_id):
            await self.ctx.emit(kind, payload)
        await self.ctx.emit("tool_result", ToolResult(id=call_id, name=name, output=verdict.message, is_error=True))

    async def _post(self, call_id: str, name: str, response: Any) -> dict[str, Any]:
        if call_id and call_id in self.broker.allowed:
            output = response if isinstance(response, str) else json.dumps(response, ensure_ascii=False)
            await self.ctx.emit_all(await self.after(call_id, name, output, is_error=False))
        return {}

    def verify(self, result: ToolResult) -> list[tuple[Kind, Payload]]:
        """A call the adapter reports ended: with the image's managed hooks under the adapter every
        call of the agent's passes them, so one that ran without an allow decision is a bypass
        (ledger.py). Not for an agent without them: only its permission requests reach policy.
        Never the adapter's own pseudo-calls (its MCP server's start), nor a call refused before
        any decision (cut off by a cancel, refused by the CLI itself)."""
        if "managed_hooks" not in self.agent.layers or result.id.startswith(MCP_STARTUP):
            return []
        unrun = self.cancelled or self.broker.ending or refused_before_deciding(result.output, True)
        if result.is_error and not self.broker.was_decided(result.id) and unrun:
            return []
        seen = self.updates.calls.get(result.id)
        shown = seen.input if seen is not None else None  # the record shows what the adapter reported
        return verify(self.ctx, result.id, result.name, error=result.is_error, shown=shown)

    async def after(self, call_id: str, name: str, output: str, *, is_error: bool) -> list[tuple[Kind, Payload]]:
        """`post_tool_use` once for a call that ran (from the hook or the adapter's result), and
        the events that show it, for the caller to store after the call's result. Under Codex
        every call passes the hook first: a result for an id that never did (the adapter reports
        its MCP server's start as a tool call) is no tool call of the agent's."""
        if call_id in self.posted or call_id in self.broker.denied:
            return []
        if self.agent.hooks == "codex" and call_id not in self.broker.allowed:
            return []
        self.posted.add(call_id)
        _, events = await post_tool(self.ctx, tool_use_id=call_id, tool_name=name, output=output, is_error=is_error)
        return events
