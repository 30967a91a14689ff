"""One ACP agent process of an acp run: the JSON-RPC session (`initialize`, `session/load` or
`session/new`, `session/prompt`, `session/cancel`), the agent's requests and updates (its
permission requests to policy.py, its updates normalised by updates.py and stored in the batches
they were read in), `stop`, the idle watchdog and the run's outcome from the turn's stop reason."""

import asyncio
import contextlib
import time
from typing import Any, Protocol

from tasks.core.agent_registry import AcpAgent, session_meta
from tasks.core.capping import HeadTail
from tasks.core.states import FailureReason, RunState
from tasks.core.transcript import Assistant, Kind, Notice, Payload, System, ToolResult
from tasks.run.backchannel import mcp_client_config
from tasks.run.runtimes.acp.policy import AcpPolicy
from tasks.run.runtimes.acp.rpc import METHOD_NOT_FOUND, AgentExited, Incoming, Peer, RpcError, failure_of
from tasks.run.runtimes.acp.session import acp_mcp_servers
from tasks.run.runtimes.acp.updates import UpdateState
from tasks.run.runtimes.agent_process import WORKDIR
from tasks.run.runtimes.base import Outcome, RunContext
from tasks.run.runtimes.policy_broker import Verdict
from tasks.run.runtimes.policy_steps import StopStep

PROTOCOL_VERSION = 1
RAW_CAP = 8 * 1024 * 1024
SETUP_TIMEOUT = 120.0  # initialize and session/new or load (an adapter starts its CLI first)
CANCEL_WAIT = 5.0  # seconds the prompt gets to end after session/cancel


class DriveSettings(Protocol):
    """What a drive reads of its runtime (acp/runtime.py's `AcpAgentRuntime` is one)."""

    agent: AcpAgent
    idle_seconds: float
    announce_wait: float


class Drive:
    """One agent process: the JSON-RPC peer, the policy paths (policy.py), the watchdog."""

    def __init__(self, runtime: DriveSettings, ctx: RunContext, session: str) -> None:
        self.runtime = runtime
        self.ctx = ctx
        self.saved = session
        self.session = ""
        self.version = ""
        self.raw = HeadTail(RAW_CAP)
        self.updates = UpdateState()
        self.policy = AcpPolicy(ctx, runtime.agent, self.updates, self._stopping)
        self.policy.announce_wait = runtime.announce_wait
        self.broker = self.policy.broker
        self.peer: Peer | None = None
        self.proc: Any = None
        self.request_ids: set[Any] = set()  # the agent's request ids seen (a reused one is refused)
        self.last_text = ""
        self.held: list[tuple[Kind, Payload]] = []  # the events of the batch being read (`settle`)
        self.last_line = time.monotonic()
        self.prompting = False
        self.prompt_ended = asyncio.Event()

    async def _stopping(self, verdict: Verdict) -> None:
        """A call parked, a question or a failed policy: the turn ends (session/cancel). The
        decision's answer (to the hook, say) waits until the turn ended (at most CANCEL_WAIT), so
        the agent does not call the model again with the refusal first."""
        await self.cancel(wait=True)

    async def cancel(self, *, wait: bool = True) -> None:
        if self.policy.cancelled or self.peer is None:
            return
        self.policy.cancelled = True  # nothing more is decided
        if self.session:
            await self.peer.notify("session/cancel", {"sessionId": self.session})
        await self.policy.cancel_open(self.peer)
        if wait and self.prompting:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(CANCEL_WAIT):
                    await self.prompt_ended.wait()

    async def on_message(self, msg: Incoming) -> None:
        assert self.peer is not None
        if msg.is_request:
            await self.settle()  # what the updates before it stood for goes first
            if msg.id in self.request_ids:
                await self.policy.note(f"the agent reused request id {msg.id!r} ({msg.method}): refused")
                await self.peer.respond_error(msg.id, -32600, "request id already used")
                return
            self.request_ids.add(msg.id)
            if msg.method == "session/request_permission":
                self.broker.spawn(self.policy.permission(self.peer, msg))
            else:  # fs/*, terminal/*: capabilities forgehand does not offer
                await self.peer.respond_error(msg.id, METHOD_NOT_FOUND, f"forgehand does not serve {msg.method}")
            return
        self.on_notification(msg.method, msg.params)

    def on_notification(self, method: str, params: Any) -> None:
        """`session/update`: what it stands for is held until the batch of lines ends (`settle`)."""
        if method == "session/update":
            update = params.get("update") if isinstance(params, dict) else None
            self.held += self.updates.feed(update)
            if isinstance(update, dict) and update.get("sessionUpdate") == "tool_call" and update.get("toolCallId"):
                # The adapter reports a call as the model's answer names it, before the CLI under
                # it runs the call's hooks: a Claude hook call for an id never reported is forged.
                self.ctx.ledger.announce(str(update["toolCallId"]))

    async def settle(self) -> None:
        """Store what the updates read so far stood for. The peer calls this after each batch of
        lines it read together and before a response reaches its request."""
        events, self.held = self.held, []
        await self._emit_all(events)

    async def _emit_all(self, events: list[tuple[Kind, Payload]]) -> None:
        """Events in order, in one writer call (one timestamp, one look for secrets). Each call's
        result is followed by what its `post_tool_use` showed (the dispatch's record), as the
        builtin loop orders them; the dispatch goes out as the result is read, before the batch
        is handed to the writer (which holds events a few milliseconds before it stores them
        in any case)."""
        out: list[tuple[Kind, Payload]] = []
        for kind, payload in events:
            out.append((kind, payload))
            if isinstance(payload, Assistant):
                self.last_text = payload.text
            elif isinstance(payload, ToolResult):
                out += self.policy.verify(payload)
                out += await self.policy.after(payload.id, payload.name, payload.output, is_error=payload.is_error)
        await self.ctx.emit_all(out)

    def _touch(self) -> None:
        self.last_line = time.monotonic()

    # --- the run --------------------------------------------------------------------------------

    async def run(self, proc: Any, prompt: str) -> Outcome:
        self.proc = proc
        peer = self.peer = Peer(proc, self.on_message, self.raw, settle=self.settle, notified=self.on_notification)
        reader = asyncio.ensure_future(peer.read(self._touch))
        try:
            return await self._session(peer, prompt)
        except AgentExited:
            return await self._exited()
        except RpcError as exc:
            return self._failed(failure_of(exc), f"{self.runtime.agent.name} refused: {exc}")
        except TimeoutError:
            return self._failed(FailureReason.IDLE, f"{self.runtime.agent.name} did not answer the session setup")
        finally:
            self.broker.cancel_tasks()
            await peer.close_stdin()
            reader.cancel()
            with contextlib.suppress(BaseException):
                await reader
            with contextlib.suppress(Exception):  # a batch the reader was cut off in
                await self.settle()

    async def _session(self, peer: Peer, prompt: str) -> Outcome:
        ctx = self.ctx
        init = await peer.request(
            "initialize",
            {
                "protocolVersion": PROTOCOL_VERSION,
                "clientCapabilities": {"fs": {"readTextFile": False, "writeTextFile": False}, "terminal": False},
                "clientInfo": {"name": "forgehand", "version": "1"},
            },
            limit=SETUP_TIMEOUT,
        )
        init = init if isinstance(init, dict) else {}
        caps: dict[str, Any] = init["agentCapabilities"] if isinstance(init.get("agentCapabilities"), dict) else {}
        info: dict[str, Any] = init["agentInfo"] if isinstance(init.get("agentInfo"), dict) else {}
        self.version = str(info.get("version") or "")[:64]
        # forgehand's back-channel (ask_user, report_summary, ...) as the session's one MCP server.
        servers = acp_mcp_servers(mcp_client_config(ctx.channel)) if ctx.channel is not None else []
        new_params: dict[str, Any] = {"cwd": WORKDIR, "mcpServers": servers}
        meta = session_meta(self.runtime.agent, ctx.limits.turn_limit)
        if meta:
            new_params["_meta"] = meta
        if self.saved and caps.get("loadSession"):
            self.updates.replaying = True
            try:
                await peer.request("session/load", {"sessionId": self.saved, **new_params}, limit=SETUP_TIMEOUT)
                self.session = self.saved
            except RpcError as exc:
                text = f"session {self.saved} could not be loaded ({exc}): a new one starts"
                await ctx.emit("notice", Notice(text=text, level="warning"))
            finally:
                self.updates.replaying = False
        elif self.saved:
            await ctx.emit("notice", Notice(text="the agent cannot load sessions: a new one starts", level="warning"))
        if not self.session:
            created = await peer.request("session/new", new_params, limit=SETUP_TIMEOUT)
            session = created.get("sessionId") if isinstance(created, dict) else None
            if not isinstance(session, str) or not session:
                return self._failed(FailureReason.AGENT_NO_RESULT, "session/new answered no sessionId")
            self.session = session[:128]
        name = self.runtime.agent.name
        verb = "loaded" if self.session == self.saved else "started"
        detail = {"agent": name, "version": self.version, "session_id": self.session, "capabilities": caps}
        text = f"{name} {self.version} {verb} session {self.session}"
        await ctx.emit("system", System(phase="agent", text=text, detail=detail))
        result = await self._prompt(peer, prompt)
        if isinstance(result, Outcome):
            return result
        if result == "end_turn" and not self._ending():
            more = await StopStep(ctx).next_message(self.last_text)
            if more:
                again = await self._prompt(peer, more)
                if isinstance(again, Outcome):
                    return again
                result = again
        return await self._outcome(result)

    async def _prompt(self, peer: Peer, text: str) -> str | Outcome:
        """One `session/prompt`; its stopReason, or the failure that ended it."""
        self.ctx.turns += 1
        self.prompting = True
        self.prompt_ended.clear()
        call = asyncio.ensure_future(
            peer.request("session/prompt", {"sessionId": self.session, "prompt": [{"type": "text", "text": text}]})
        )
        try:
            while True:
                done, _ = await asyncio.wait({call}, timeout=1.0)
                if done:
                    break
                quiet = time.monotonic() - self.last_line
                if quiet > self.runtime.idle_seconds and not self.broker_busy():
                    call.cancel()
                    with contextlib.suppress(Exception):
                        await self.proc.kill()
                    idle = f"{self.runtime.agent.name} printed nothing for {self.runtime.idle_seconds:g} s"
                    return self._failed(FailureReason.IDLE, f"{idle}: killed as idle")
            response = call.result()
        finally:
            self.prompting = False
            self.prompt_ended.set()
        await self.settle()
        await self._emit_all(self.updates.flush() + self.updates.pending_calls())
        response = response if isinstance(response, dict) else {}
        self._account(response.get("usage"))
        stop = str(response.get("stopReason") or "")
        usage = self.updates.usage
        detail = {"stop_reason": stop, "usage": response.get("usage"), "context": usage}
        text = f"{self.runtime.agent.name} turn ended: {stop}"
        await self.ctx.emit("system", System(phase="agent_result", text=text, detail=detail))
        return stop

    def broker_busy(self) -> bool:
        """A decision is being taken (a consumer, a person): silence then is not the agent's."""
        return bool(self.policy.open) or bool(self.broker.tasks)

    def _account(self, usage: Any) -> None:
        if not isinstance(usage, dict):
            return

        def num(key: str) -> int:
            value = usage.get(key)
            return value if isinstance(value, int) and value >= 0 else 0

        self.ctx.prompt_tokens += num("inputTokens") + num("cachedReadTokens") + num("cachedWriteTokens")
        self.ctx.completion_tokens += num("outputTokens")

    def _ending(self) -> bool:
        return self.broker.ending

    def _failed(self, reason: FailureReason, text: str) -> Outcome:
        return Outcome(status=RunState.FAILED, failure_reason=reason, error=text)

    async def _exited(self) -> Outcome:
        exit_code: int | None = None
        with contextlib.suppress(Exception):
            async with asyncio.timeout(5):
                exit_code = await self.proc.wait()
        tail = (getattr(self.proc, "stderr_tail", "") or "").strip()[-1000:]
        text = f"{self.runtime.agent.name} exited (code {exit_code}) before its turn ended"
        text += f": {tail}" if tail else ""
        outcome = self._failed(FailureReason.AGENT_NO_RESULT, text)
        outcome.exit_code = exit_code
        return await self.broker.ended() or outcome

    async def _outcome(self, stop: str) -> Outcome:
        ended = await self.broker.ended()
        if ended is not None:
            return ended
        name = self.runtime.agent.name
        if stop == "end_turn":
            return Outcome(status=RunState.SUCCEEDED, summary=self.last_text)
        if stop == "max_turn_requests":
            return self._failed(FailureReason.TURN_LIMIT, f"{name} reached its turn limit")
        if stop == "cancelled":
            return self._failed(FailureReason.INTERRUPTED, f"{name}'s turn was cancelled")
        return self._failed(FailureReason.MODEL_ERROR, f"{name} ended its turn with {stop or 'no stop reason'}")
