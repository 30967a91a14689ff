"""The `acp` runtime: an operator-configured agent that speaks the Agent Client Protocol on its
stdio, inside the sandbox, with forgehand as the ACP client (AGENTS.md decisions 2 to 5; the
operator's view is docs/agents.md "ACP agents"). A task names the agent (`agent_command`, the
registry in tasks/core/agent_registry.py); `AcpRuntime.for_task` binds it for one run. The
JSON-RPC client is forgehand's own (acp_rpc.py says why not PyPI `agent-client-protocol`).

One run: `initialize` (no `fs`, no `terminal`: the agent acts itself, inside the sandbox, where
the managed hooks see it), `session/load` of the task's session when the agent can load, else
`session/new`, then `session/prompt`. `session/update` becomes transcript events
(acp_updates.py). `session/request_permission` becomes `pre_tool_use` (name, kind, exact
`rawInput`) through the claude-code runtime's `PolicyBroker`, shared with the managed hook (one
dispatch per tool call id); the option is picked by kind (`choose_option`); `ask` parks the call
and cancels the turn. A stop sends `session/cancel` and answers open requests `cancelled`. Odd
input is decided safely and never crashes the run (tests/integration/test_acp_protocol.py)."""

import asyncio
import contextlib
import json
import time
from typing import Any

from forge.core.settings import Settings
from sandbox import SandboxError
from sandbox.spec import HOME_DIR
from tasks.core.agent_registry import AcpAgent, acp_agent, session_meta
from tasks.core.capping import HeadTail
from tasks.core.states import FailureReason, RunState
from tasks.core.transcript import Assistant, Kind, Notice, Payload, System, ToolResult
from tasks.run.backchannel import mcp_client_config
from tasks.run.runtimes.acp_policy import AcpPolicy
from tasks.run.runtimes.acp_rpc import METHOD_NOT_FOUND, AgentExited, Incoming, Peer, RpcError, failure_of
from tasks.run.runtimes.acp_session import acp_mcp_servers, home_of, keep, restore
from tasks.run.runtimes.acp_updates import UpdateState
from tasks.run.runtimes.agent_session import prompt_of, scrub
from tasks.run.runtimes.base import Outcome, RunContext, RuntimeUnavailable
from tasks.run.runtimes.claude_control import Verdict
from tasks.run.runtimes.codex_config import codex_settings, config_toml, nested, write_config
from tasks.run.runtimes.policy_steps import record

PROTOCOL_VERSION = 1
WORKDIR = "/workspace"
RAW_CAP = 8 * 1024 * 1024
SETUP_TIMEOUT = 120.0  # initialize and session/new or load (an adapter starts its CLI first)
CANCEL_WAIT = 5.0  # seconds the prompt gets to end after session/cancel


class AcpRuntime:
    """The `acp` entry of RUNTIMES: unbound; `for_task` gives the runtime of one run."""

    name = "acp"

    def __init__(self, *, agents_path: str | None = None, idle_seconds: float = 300.0) -> None:
        self.agents_path = agents_path  # None = the instance's FORGEHAND_ACP_AGENTS
        self.idle_seconds = idle_seconds

    def needs_model(self) -> bool:
        return True

    def for_task(self, command: Any, settings: Settings) -> "AcpAgentRuntime":
        name = command if isinstance(command, str) else ""
        path = settings.acp_agents if self.agents_path is None else self.agents_path
        try:
            agent = acp_agent(path, name)
        except ValueError as exc:
            raise RuntimeUnavailable(str(exc), FailureReason.INTERNAL) from None
        if agent is None:
            raise RuntimeUnavailable(f"no ACP agent named {name!r} is configured", FailureReason.INTERNAL)
        return AcpAgentRuntime(agent, idle_seconds=self.idle_seconds)

    async def run(self, ctx: RunContext) -> Outcome:
        raise RuntimeUnavailable("the acp runtime runs a configured agent (agent_command)", FailureReason.INTERNAL)


class AcpAgentRuntime:
    """One configured ACP agent, for one run."""

    name = "acp"

    def __init__(self, agent: AcpAgent, *, idle_seconds: float = 300.0) -> None:
        self.agent = agent
        self.idle_seconds = idle_seconds
        self.model_provider = "openai" if agent.provider == "openai" else "anthropic"
        self.image = agent.image  # "" = the agents image
        self.agent_label = agent.package  # the agents image must carry it ("" = no label check)
        self._drive: _Drive | None = None

    def needs_model(self) -> bool:
        return self.agent.provider != "none"

    def image_kind(self) -> str:
        return "agents"

    async def stopping(self) -> None:
        """The run is being stopped: cancel the turn the ACP way before the sandbox goes."""
        if self._drive is not None:
            await self._drive.cancel()

    def env(self, ctx: RunContext) -> dict[str, str]:
        env = {"HOME": HOME_DIR, **self.agent.env}
        channel = ctx.channel
        if channel is None:
            return env
        env["FORGEHAND_RUN_TOKEN"] = channel.token
        if self.agent.provider == "anthropic":
            env.update(
                ANTHROPIC_BASE_URL="http://localhost",
                ANTHROPIC_UNIX_SOCKET=channel.container_socket,
                ANTHROPIC_AUTH_TOKEN=channel.token,
                CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
                DISABLE_AUTOUPDATER="1",
                CLAUDE_CODE_MAX_RETRIES="4",
            )
            if channel.provider.anthropic_model:
                env["ANTHROPIC_MODEL"] = channel.provider.anthropic_model
        if self.agent.codex_config:
            # The same settings as the config file, as the adapter's session config: they outrank
            # a repository's `.codex/config.toml` (the adapter trusts the session's project).
            model = channel.provider.openai_model
            config = nested(self.codex_settings(ctx), model=model)
            env.update(CODEX_HOME=f"{HOME_DIR}/.codex", CODEX_CONFIG=json.dumps(config))
        return env

    def codex_settings(self, ctx: RunContext) -> list[tuple[str, Any]]:
        allow = ctx.channel is not None and ctx.channel.provider.allow_web_search
        return codex_settings(allow_web_search=bool(allow))

    async def run(self, ctx: RunContext) -> Outcome:
        if self.agent.provider != "none" and ctx.channel is None:
            raise RuntimeUnavailable("no model gateway for this run", FailureReason.MODEL_UNREACHABLE)
        session = await restore(ctx, self.agent)
        drive = _Drive(self, ctx, session)
        self._drive = drive
        if ctx.channel is not None:
            ctx.channel.set_hook_handler(drive.policy.on_hook)
        if ctx.backchannel is not None:
            ctx.backchannel.set_question_hook(drive.on_question)
        try:
            await scrub(ctx, home_of(self.agent))
            if self.agent.codex_config and ctx.channel is not None:
                await write_config(ctx, config_toml(self.codex_settings(ctx), model=ctx.channel.provider.openai_model))
            proc = await ctx.sandbox.spawn(
                list(self.agent.command), env=self.env(ctx), cwd=WORKDIR, timeout=max(1.0, ctx.sandbox.remaining)
            )
        except SandboxError as exc:
            raise RuntimeUnavailable(f"{self.agent.name} could not start: {exc}", FailureReason.INTERNAL) from exc
        try:
            outcome = await drive.run(proc, prompt_of(ctx, session))
        finally:
            with contextlib.suppress(Exception):
                await proc.kill()
            ctx.agent_name = self.agent.name
            ctx.agent_session_id = drive.session or ctx.agent_session_id
            ctx.agent_version = drive.version or ctx.agent_version
            await keep(ctx, self.agent, drive.session, drive.raw.text())
        return outcome


class _Drive:
    """One agent process: the JSON-RPC peer, the policy paths (acp_policy.py), the watchdog."""

    def __init__(self, runtime: AcpAgentRuntime, ctx: RunContext, session: str) -> None:
        self.runtime = runtime
        self.ctx = ctx
        self.saved = session
        self.session = ""
        self.version = ""
        self.raw = HeadTail(RAW_CAP)
        self.updates = UpdateState()
        self.policy = AcpPolicy(ctx, runtime.agent, self.updates, self._stopping)
        self.broker = self.policy.broker
        self.peer: Peer | None = None
        self.proc: Any = None
        self.request_ids: set[Any] = set()  # the agent's request ids seen (a reused one is refused)
        self.last_text = ""
        self.held: list[tuple[Kind, Payload]] = []  # the events of the batch being read (`settle`)
        self.last_line = time.monotonic()
        self._tasks: set[asyncio.Task[None]] = set()
        self.prompting = False
        self.prompt_ended = asyncio.Event()

    async def _stopping(self, verdict: Verdict) -> None:
        """A call parked, a question or a failed policy: the turn ends (session/cancel). The
        decision's answer (to the hook, say) waits until the turn ended (at most CANCEL_WAIT), so
        the agent does not call the model again with the refusal first."""
        await self.cancel(wait=True)

    async def on_question(self, text: str, options: list[str]) -> None:
        """The back-channel's ask_user: the run blocks on the question; the turn ends."""
        if not self.broker.question:
            self.broker.question, self.broker.question_options = text, options
            self._spawn(self._stopping(Verdict(behavior="deny", stop="question")))

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
                self._spawn(self.policy.permission(self.peer, msg))
            else:  # fs/*, terminal/*: capabilities forgehand does not offer
                await self.peer.respond_error(msg.id, METHOD_NOT_FOUND, f"forgehand does not serve {msg.method}")
            return
        self.on_notification(msg.method, msg.params)

    def on_notification(self, method: str, params: Any) -> None:
        """`session/update`: what it stands for is held until the batch of lines ends (`settle`)."""
        if method == "session/update":
            self.held += self.updates.feed(params.get("update") if isinstance(params, dict) else None)

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

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

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
            for task in list(self._tasks):
                task.cancel()
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
            decision = await ctx.gate.stop(ctx.gate_ctx, summary=self.last_text, turns=ctx.turns, changed_files=[])
            await record(ctx, decision)
            if decision.model_context.strip():
                again = await self._prompt(peer, decision.model_context)
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
        return bool(self.policy.open) or bool(self._tasks)

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
