"""The `claude-code` runtime: the real Claude Code CLI inside the agents image, driven over its
stdio control channel, under forgehand's policy (docs/agents.md, "Claude Code: how policy is enforced").

What the CLI 2.1.332 does, measured on the host against a scripted Anthropic server
(`ANTHROPIC_BASE_URL=http://127.0.0.1:PORT`, `CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1`, a
temporary `HOME`), and relied on here:
- `claude -p --input-format stream-json --output-format stream-json --verbose
  --permission-prompt-tool stdio --setting-sources user --model M` reads one JSON line per user
  message on stdin: `{"type":"user","session_id":"","message":{"role":"user","content":TEXT},
  "parent_tool_use_id":null}`. No `initialize` control request is needed for `can_use_tool` to
  arrive (it answers one with its commands, agents and models when sent).
- Before a tool runs it writes `{"type":"control_request","request_id":UUID,"request":{"subtype":
  "can_use_tool","tool_name","display_name","input","description","permission_suggestions":[...],
  "blocked_path"?,"tool_use_id"}}` and waits for `{"type":"control_response","response":{"subtype":
  "success","request_id","response":{"behavior":"allow","updatedInput":{}}}}` (the updated input is
  what runs) or `{"behavior":"deny","message":REASON}`: the model's next request carries
  `{"type":"tool_result","content":REASON,"is_error":true}` and the final `result` lists the call in
  `permission_denials`. `"interrupt":true` on a deny ends the turn (`[Request interrupted by user
  for tool use]`, a `result` with `stop_reason` `tool_use`, exit code 1).
- A repository `.claude/settings.json` and `.claude/settings.local.json` with
  `permissions.allow: ["Bash"]`, `defaultMode: bypassPermissions`, `disableAllHooks: true` and
  their own hooks changed nothing: `can_use_tool` still came for Bash, the repository's hook never
  ran and hooks passed by forgehand still ran (`--setting-sources user`).
- PreToolUse hooks run before `can_use_tool`; see claude_control.py for how the two meet.
- Read-only tools (Read, Glob, Grep) never ask `can_use_tool` in the default permission mode: the
  managed hook is their gate.
- A `Task` subagent runs in the background: `system/task_started`, its lines with
  `parent_tool_use_id` = the Task call's id and an `agent_id`, `system/task_notification` when it
  ends; its tool calls ask `can_use_tool` like the parent's.
- Model traffic: only `POST /v1/messages?beta=true`, streaming, `Authorization: Bearer <token>`,
  `User-Agent: claude-cli/2.1.332 (external, sdk-cli)`; about 0.5 s from start to the first request.
- `--resume SESSION_ID` in a fresh `HOME` holding only the saved `.claude/projects/` continues the
  session with the same id; the next request carries the whole earlier conversation. Sessions live in
  `$HOME/.claude/projects/<cwd with / as ->/<id>.jsonl`, so the working directory must stay
  `/workspace`.

Resume (docs/agents.md): after each run `$HOME/.claude/projects` (the session transcripts, nothing the
agent could configure the CLI with) is archived through the sandbox (tar, capped)
into the task's state directory on the host (`<data_dir>/agents/<task uuid>/claude-home.tgz`; it is
opaque data, never unpacked on the host) and unpacked into the next run's fresh container before
`--resume`. The raw stream of each run is kept there too, capped (`runs/<run uuid>.jsonl`)."""

import asyncio
import contextlib
import json
import uuid
from typing import Any

from sandbox import SandboxError
from sandbox.spec import HOME_DIR
from tasks.core.capping import HeadTail
from tasks.core.states import FailureReason, RunState
from tasks.core.transcript import ToolCall, ToolResult
from tasks.run.backchannel import claude_mcp_config
from tasks.run.runtimes.agent_session import CLAUDE_HOME, HOME_CAP, keep, prompt_of, restore, scrub
from tasks.run.runtimes.base import Outcome, RunContext, RuntimeUnavailable
from tasks.run.runtimes.claude_control import (
    PolicyBroker,
    Verdict,
    control_answer,
    control_error,
    hook_answer,
    hook_refusal,
    interrupt_request,
    refused_before_deciding,
)
from tasks.run.runtimes.claude_stream import StreamState, usage_of
from tasks.run.runtimes.cli_lines import StdoutReader, json_line
from tasks.run.runtimes.ledger import ANNOUNCE_WAIT, NOT_GIVEN
from tasks.run.runtimes.policy_steps import after_tool, record, verify

AGENT_NAME = "claude-code"
CLI_PATH = "/usr/local/bin/claude"
WORKDIR = "/workspace"
RAW_CAP = 8 * 1024 * 1024  # the raw stream artefact of one run (head and tail kept)
INTERRUPT_WAIT = 5.0  # seconds a stopping hook answer waits for the CLI to confirm the interrupt


class ClaudeCodeRuntime:
    name = AGENT_NAME

    def __init__(
        self,
        *,
        cli: str = CLI_PATH,
        idle_seconds: float = 300.0,
        linger_seconds: float = 10.0,
        home_cap: int = HOME_CAP,
        announce_wait: float = ANNOUNCE_WAIT,
    ) -> None:
        self.cli = cli
        self.announce_wait = announce_wait  # a hook call waits this long for its id in the stream
        self.idle_seconds = idle_seconds  # stdout silent this long: killed (idle)
        self.linger_seconds = linger_seconds  # alive this long after its final result: killed
        self.home_cap = home_cap

    def needs_model(self) -> bool:
        return True

    def image_kind(self) -> str:
        return "agents"

    async def run(self, ctx: RunContext) -> Outcome:
        channel = ctx.channel
        if channel is None:
            raise RuntimeUnavailable("no model gateway for this run", FailureReason.MODEL_UNREACHABLE)
        session = await restore(ctx)
        model = channel.provider.anthropic_model
        argv = [
            self.cli,
            "-p",
            "--input-format",
            "stream-json",
            "--output-format",
            "stream-json",
            "--verbose",
            "--permission-prompt-tool",
            "stdio",
            "--setting-sources",
            "user",
            # No MCP server from anywhere (a repository's .mcp.json, a user file the agent wrote):
            # an MCP server is a process the agent would start outside any tool call's policy.
            "--strict-mcp-config",
            # ... but the run's own back-channel (tasks/run/backchannel), served by forgehand.
            *(["--mcp-config", claude_mcp_config(channel)] if ctx.backchannel is not None else []),
            "--max-turns",
            str(ctx.limits.turn_limit),
        ]
        if model:
            argv += ["--model", model]
        if session:
            argv += ["--resume", session]
        env = {
            "FORGEHAND_RUN_TOKEN": channel.token,
            "ANTHROPIC_BASE_URL": "http://localhost",
            "ANTHROPIC_UNIX_SOCKET": channel.container_socket,
            "ANTHROPIC_AUTH_TOKEN": channel.token,
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1",
            # As many attempts as the builtin runtime's (the CLI's default retries for minutes).
            "CLAUDE_CODE_MAX_RETRIES": "4",
            "HOME": HOME_DIR,
            # The back-channel's four tools go in the tool list itself, not behind a tool search.
            "ENABLE_TOOL_SEARCH": "false",
        }
        if model:
            env["ANTHROPIC_MODEL"] = model
        drive = _Drive(self, ctx, session)
        channel.set_hook_handler(drive.on_hook)
        if ctx.backchannel is not None:
            ctx.backchannel.set_question_hook(drive.on_question)
        try:
            await scrub(ctx, CLAUDE_HOME)
            proc = await ctx.sandbox.spawn(argv, env=env, cwd=WORKDIR, timeout=max(1.0, ctx.sandbox.remaining))
        except SandboxError as exc:
            raise RuntimeUnavailable(f"claude could not start: {exc}", FailureReason.INTERNAL) from exc
        try:
            outcome = await drive.run(proc, prompt_of(ctx, session))
        finally:
            with contextlib.suppress(Exception):
                await proc.kill()
            ctx.agent_name = AGENT_NAME
            await keep(ctx, drive.state, drive.raw_text(), home_cap=self.home_cap)
        return outcome


class _Drive:
    """One CLI process: the stdout reader, the control channel, the hook path and the watchdogs."""

    def __init__(self, runtime: ClaudeCodeRuntime, ctx: RunContext, session: str) -> None:
        self.runtime = runtime
        self.ctx = ctx
        self.session = session
        self.state = StreamState()
        self.broker = PolicyBroker(ctx, self._stopping)
        self.raw = HeadTail(RAW_CAP)
        self.proc: Any = None
        self._writes = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()
        self.posted: set[str] = set()
        self.stdin_open = True
        self._answers: dict[str, asyncio.Future[None]] = {}  # our control requests, by id

    def raw_text(self) -> str:
        return self.raw.text()

    async def send(self, obj: dict[str, Any]) -> None:
        if not self.stdin_open or self.proc is None:
            return
        async with self._writes:
            with contextlib.suppress(Exception):
                await self.proc.write((json.dumps(obj, ensure_ascii=False) + "\n").encode())

    async def close_stdin(self) -> None:
        if self.stdin_open and self.proc is not None:
            self.stdin_open = False
            with contextlib.suppress(Exception):
                await self.proc.close_stdin()

    async def _stopping(self, verdict: Verdict) -> None:
        """A call parked for approval, a question or a failed policy: the turn ends now. The hook
        path has no `interrupt` of its own, so one is sent on the control channel, and the hook's
        answer waits (briefly) until the CLI confirmed it: the model is not called again."""
        request_id = f"fh_{uuid.uuid4().hex[:12]}"
        confirmed = asyncio.get_running_loop().create_future()
        self._answers[request_id] = confirmed
        await self.send(interrupt_request(request_id))
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(INTERRUPT_WAIT):
                await asyncio.shield(confirmed)
        self._answers.pop(request_id, None)

    async def on_question(self, text: str, options: list[str]) -> None:
        """The back-channel's ask_user: the run blocks on the question; later calls are refused."""
        if not self.broker.question:
            self.broker.question, self.broker.question_options = text, options
            self._spawn(self._stopping(Verdict(behavior="deny", stop="question")))

    async def on_hook(self, agent: str, event: str, body: dict[str, Any]) -> dict[str, Any]:
        """`POST /hooks/claude/<event>` from the managed hook (the backstop)."""
        if agent != "claude":
            return hook_refusal(event, f"forgehand: no {agent} agent in this run")
        if event != "PreToolUse":
            return {}  # post_tool_use and stop are dispatched from the stream, once
        name, tool_input = body.get("tool_name"), body.get("tool_input")
        if not isinstance(name, str) or not name:
            return hook_refusal(event, "forgehand: the hook input names no tool")
        call_id = body.get("tool_use_id")
        # The CLI prints a call on its stdout before it runs the call's hooks; a hook call for an
        # id the stream never showed comes from something else in the sandbox: no policy is asked.
        if not isinstance(call_id, str) or not await self.ctx.ledger.announced(call_id, self.runtime.announce_wait):
            return hook_refusal(event, "forgehand: no such tool call was announced in the agent's stream")
        verdict = await self.broker.decide(call_id, name, tool_input)
        return hook_answer(event, verdict)

    async def _can_use_tool(self, request_id: str, req: dict[str, Any]) -> None:
        try:
            verdict = await self.broker.decide(
                str(req.get("tool_use_id") or ""), str(req.get("tool_name") or ""), req.get("input")
            )
        except Exception as exc:  # a broken gate never lets the call run
            await self.send(control_error(request_id, f"forgehand policy error: {type(exc).__name__}"))
            raise
        await self.send(control_answer(request_id, verdict, req.get("input")))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _control(self, line: dict[str, Any]) -> None:
        request_id = str(line.get("request_id") or "")
        req: dict[str, Any] = line["request"] if isinstance(line.get("request"), dict) else {}
        subtype = req.get("subtype")
        if subtype == "can_use_tool":
            self._spawn(self._can_use_tool(request_id, req))
        else:  # hook callbacks and MCP messages are not registered by forgehand: refuse
            await self.send(control_error(request_id, f"forgehand does not serve {subtype!r}"))

    async def _verify(self, result: ToolResult) -> None:
        """A result the stream shows: the call ran only on an allow decision of forgehand's. A call
        the CLI refused itself, or one cut off by an interrupt before any decision, never ran."""
        call_id = result.id
        undecided_error = result.is_error and not self.broker.was_decided(call_id)
        if undecided_error and (refused_before_deciding(result.output, True) or self._ending()):
            return
        seen = self.state.calls.get(call_id)
        tool_input = seen.input if seen is not None else NOT_GIVEN
        events = verify(self.ctx, call_id, seen.name if seen else result.name, tool_input, error=result.is_error)
        await self.ctx.emit_all(events)

    async def _post_tool_use(self, call_id: str, name: str, output: str, is_error: bool) -> None:
        if not call_id or call_id in self.posted or call_id in self.broker.denied:
            return  # a call that never ran has no post_tool_use
        if is_error and not self.broker.was_decided(call_id):
            return  # cut off before any decision (the turn was interrupted): it never ran either
        self.posted.add(call_id)
        await after_tool(self.ctx, tool_use_id=call_id, tool_name=name, output=output, is_error=is_error)

    async def run(self, proc: Any, prompt: str) -> Outcome:
        self.proc = proc
        ctx = self.ctx
        reader = StdoutReader(proc)
        await self.send({"type": "user", "session_id": "", "message": {"role": "user", "content": prompt},
                         "parent_tool_use_id": None})  # fmt: skip
        continued = False
        final: dict[str, Any] | None = None
        watchdog: tuple[FailureReason, str] | None = None
        try:
            while True:
                limit = self.runtime.linger_seconds if not self.stdin_open else self.runtime.idle_seconds
                try:
                    raw = await reader.next_line(limit)
                except TimeoutError:
                    if not self.stdin_open and final is not None:
                        watchdog = (
                            FailureReason.AGENT_LINGERED,
                            f"claude was still running {limit:g} s after its final result: killed",
                        )
                    else:
                        watchdog = (FailureReason.IDLE, f"claude printed nothing for {limit:g} s: killed as idle")
                    break
                if raw is None:
                    break
                line = json_line(raw, self.raw)
                if line is None:
                    continue
                if line.get("type") == "control_request":
                    await self._control(line)
                    continue
                if line.get("type") == "control_response":
                    response: dict[str, Any] = line["response"] if isinstance(line.get("response"), dict) else {}
                    waiting = self._answers.get(str(response.get("request_id") or ""))
                    if waiting is not None and not waiting.done():
                        waiting.set_result(None)
                    continue
                for kind, payload in self.state.feed(line):
                    await ctx.emit(kind, payload)  # type: ignore[arg-type]
                    if isinstance(payload, ToolCall):
                        ctx.ledger.announce(payload.id)
                    elif isinstance(payload, ToolResult):
                        await self._verify(payload)
                        seen = self.state.calls.get(payload.id)
                        await self._post_tool_use(
                            payload.id, seen.name if seen else "", payload.output, payload.is_error
                        )
                if line.get("type") != "result" or not self.stdin_open:
                    continue
                if self.state.background or self._tasks:
                    continue  # a background subagent (or a decision) still runs: more will come
                final = line
                if self._ending() or line.get("is_error"):
                    await self.close_stdin()
                    continue
                summary = str(line.get("result") or "")
                decision = await ctx.gate.stop(ctx.gate_ctx, summary=summary, turns=ctx.turns, changed_files=[])
                await record(ctx, decision)
                if decision.model_context.strip() and not continued:
                    continued = True
                    final = None
                    await self.send({"type": "user", "session_id": "", "parent_tool_use_id": None,
                                     "message": {"role": "user", "content": decision.model_context}})  # fmt: skip
                    continue
                await self.close_stdin()
        finally:
            await self.close_stdin()
            for task in list(self._tasks):
                task.cancel()
            if watchdog is not None:
                with contextlib.suppress(Exception):
                    await proc.kill()
            await reader.close()
        exit_code: int | None = None
        with contextlib.suppress(Exception):
            async with asyncio.timeout(self.runtime.linger_seconds):
                exit_code = await proc.wait()
        if exit_code is None and watchdog is None and final is not None:
            watchdog = (
                FailureReason.AGENT_LINGERED,
                f"claude was still running {self.runtime.linger_seconds:g} s after its final result: killed",
            )
        self._account()
        return await self._outcome(self.state.final, watchdog, exit_code)

    def _ending(self) -> bool:
        return self.broker.ending

    def _account(self) -> None:
        ctx = self.ctx
        results = self.state.results
        if results:
            turns = results[-1].get("num_turns")
            ctx.turns += turns if isinstance(turns, int) and turns > 0 else 0
        for result in results:
            prompt, completion = usage_of(result)
            ctx.prompt_tokens += prompt
            ctx.completion_tokens += completion

    async def _outcome(
        self, final: dict[str, Any] | None, watchdog: tuple[FailureReason, str] | None, exit_code: int | None
    ) -> Outcome:
        ended = await self.broker.ended(exit_code)
        if ended is not None:
            return ended
        if watchdog is not None and (final is None or watchdog[0] is not FailureReason.AGENT_LINGERED):
            return Outcome(status=RunState.FAILED, failure_reason=watchdog[0], error=watchdog[1], exit_code=exit_code)
        if final is None:
            tail = (getattr(self.proc, "stderr_tail", "") or "").strip()[-1000:]
            text = f"claude exited (code {exit_code}) without a final result" + (f": {tail}" if tail else "")
            return Outcome(
                status=RunState.FAILED, failure_reason=FailureReason.AGENT_NO_RESULT, error=text, exit_code=exit_code
            )
        if watchdog is not None:
            return Outcome(status=RunState.FAILED, failure_reason=watchdog[0], error=watchdog[1], exit_code=exit_code)
        if final.get("is_error") or final.get("subtype") != "success":
            return Outcome(
                status=RunState.FAILED,
                failure_reason=_failure_of(final),
                error=error_text(final),
                exit_code=exit_code,
            )
        return Outcome(status=RunState.SUCCEEDED, summary=str(final.get("result") or ""), exit_code=exit_code)


# How a `result` line's error subtypes read for a person (`success` with `is_error`: a model call
# failed for good; the result text says why).
_ENDINGS = {
    "error_max_turns": "it reached its turn limit",
    "error_max_budget_usd": "it reached its cost budget",
    "error_during_execution": "an error during execution",
}


def error_text(result: dict[str, Any]) -> str:
    """The task's error for a `result` line that ended in an error: never its subtype `success`."""
    subtype = str(result.get("subtype") or "")
    why = _ENDINGS.get(subtype, "" if subtype in ("", "success") else subtype.replace("_", " "))
    said = str(result.get("result") or "").strip()[:2000]
    head = f"claude ended with an error ({why})" if why else "claude ended with an error"
    return f"{head}: {said}" if said else head


_UNREACHABLE = ("connection", "econnrefused", "etimedout", "enotfound", "timed out", "socket")


def _failure_of(result: dict[str, Any]) -> FailureReason:
    """The typed reason of an error `result`. Measured: a model call that failed for good ends
    with `terminal_reason` `api_error` and `result` "API Error: 500 ..." / "API Error: Request
    rejected (429) ..." / "API Error: Connection refused ... (ECONNREFUSED)"."""
    subtype = str(result.get("subtype") or "")
    if subtype == "error_max_turns":
        return FailureReason.TURN_LIMIT
    if subtype == "error_max_budget_usd":
        return FailureReason.TOKEN_BUDGET
    text = str(result.get("result") or "").lower()
    status = result.get("api_error_status")
    if result.get("terminal_reason") == "api_error" or text.startswith("api error") or isinstance(status, int):
        if isinstance(status, int) and status in (502, 503, 504):
            return FailureReason.MODEL_UNREACHABLE
        return FailureReason.MODEL_UNREACHABLE if any(w in text for w in _UNREACHABLE) else FailureReason.MODEL_ERROR
    return FailureReason.EXIT_CODE
