"""One Claude Code process of a claude-code run: its stdout read and normalised (stream.py), the
control channel (`can_use_tool` answered, the interrupt that ends a turn), the managed hook's
`PreToolUse` (the backstop), the calls verified against the decisions, `post_tool_use`, `stop`,
the watchdogs (stdout silence, a process that lingers after its final result) and the run's
outcome from how it ended."""

import asyncio
import contextlib
import json
import uuid
from typing import Any, Protocol

from tasks.core.capping import HeadTail
from tasks.core.states import FailureReason, RunState
from tasks.core.transcript import ToolCall, ToolResult
from tasks.run.runtimes.base import Outcome, RunContext
from tasks.run.runtimes.claude.control import control_answer, control_error, interrupt_request
from tasks.run.runtimes.claude.stream import StreamState, error_text, failure_of, usage_of
from tasks.run.runtimes.cli_lines import StdoutReader, json_line
from tasks.run.runtimes.ledger import NOT_GIVEN
from tasks.run.runtimes.policy_broker import PolicyBroker, Verdict, hook_answer, hook_refusal, refused_before_deciding
from tasks.run.runtimes.policy_steps import StopStep, after_tool, verify

RAW_CAP = 8 * 1024 * 1024  # the raw stream artefact of one run (head and tail kept)
INTERRUPT_WAIT = 5.0  # seconds a stopping hook answer waits for the CLI to confirm the interrupt


class DriveSettings(Protocol):
    """What a drive reads of its runtime (claude/runtime.py's `ClaudeCodeRuntime` is one)."""

    idle_seconds: float
    linger_seconds: float
    announce_wait: float


class Drive:
    """One CLI process: the stdout reader, the control channel, the hook path and the watchdogs."""

    def __init__(self, runtime: DriveSettings, ctx: RunContext, session: str) -> None:
        self.runtime = runtime
        self.ctx = ctx
        self.session = session
        self.state = StreamState()
        self.broker = PolicyBroker(ctx, self._stopping)
        self.raw = HeadTail(RAW_CAP)
        self.proc: Any = None
        self._writes = asyncio.Lock()
        self.posted: set[str] = set()
        self.stdin_open = True
        self._answers: dict[str, asyncio.Future[None]] = {}  # our control requests, by id
        self.stop = StopStep(ctx)
        self.final: dict[str, Any] | None = None  # the result line the run ends with

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

    async def _control(self, line: dict[str, Any]) -> None:
        request_id = str(line.get("request_id") or "")
        req: dict[str, Any] = line["request"] if isinstance(line.get("request"), dict) else {}
        subtype = req.get("subtype")
        if subtype == "can_use_tool":
            self.broker.spawn(self._can_use_tool(request_id, req))
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
        reader = StdoutReader(proc)
        await self._say(prompt)
        watchdog: tuple[FailureReason, str] | None = None
        try:
            watchdog = await self._read(reader)
        finally:
            await self.close_stdin()
            self.broker.cancel_tasks()
            if watchdog is not None:
                with contextlib.suppress(Exception):
                    await proc.kill()
            await reader.close()
        exit_code: int | None = None
        with contextlib.suppress(Exception):
            async with asyncio.timeout(self.runtime.linger_seconds):
                exit_code = await proc.wait()
        if exit_code is None and watchdog is None and self.final is not None:
            watchdog = (
                FailureReason.AGENT_LINGERED,
                f"claude was still running {self.runtime.linger_seconds:g} s after its final result: killed",
            )
        self._account()
        return await self._outcome(self.state.final, watchdog, exit_code)

    async def _say(self, text: str) -> None:
        """A user message on the CLI's stdin (the prompt, a stop policy's model context)."""
        await self.send({"type": "user", "session_id": "", "message": {"role": "user", "content": text},
                         "parent_tool_use_id": None})  # fmt: skip

    async def _read(self, reader: StdoutReader) -> tuple[FailureReason, str] | None:
        """The CLI's lines until its stdout ends: the watchdog that stopped the reading, if one did."""
        while True:
            limit = self.runtime.linger_seconds if not self.stdin_open else self.runtime.idle_seconds
            try:
                raw = await reader.next_line(limit)
            except TimeoutError:
                if not self.stdin_open and self.final is not None:
                    return (
                        FailureReason.AGENT_LINGERED,
                        f"claude was still running {limit:g} s after its final result: killed",
                    )
                return (FailureReason.IDLE, f"claude printed nothing for {limit:g} s: killed as idle")
            if raw is None:
                return None
            line = json_line(raw, self.raw)
            if line is not None:
                await self._line(line)

    async def _line(self, line: dict[str, Any]) -> None:
        if line.get("type") == "control_request":
            await self._control(line)
            return
        if line.get("type") == "control_response":
            response: dict[str, Any] = line["response"] if isinstance(line.get("response"), dict) else {}
            waiting = self._answers.get(str(response.get("request_id") or ""))
            if waiting is not None and not waiting.done():
                waiting.set_result(None)
            return
        ctx = self.ctx
        for kind, payload in self.state.feed(line):
            await ctx.emit(kind, payload)  # type: ignore[arg-type]
            if isinstance(payload, ToolCall):
                ctx.ledger.announce(payload.id)
            elif isinstance(payload, ToolResult):
                await self._verify(payload)
                seen = self.state.calls.get(payload.id)
                await self._post_tool_use(payload.id, seen.name if seen else "", payload.output, payload.is_error)
        if line.get("type") == "result" and self.stdin_open:
            await self._result(line)

    async def _result(self, line: dict[str, Any]) -> None:
        """A `result` line: the turn ended. The run ends with it (stdin closed), unless a subagent or a
        decision still runs, or the stop policy gives the agent more to do."""
        if self.state.background or self.broker.tasks:
            return  # a background subagent (or a decision) still runs: more will come
        self.final = line
        if self._ending() or line.get("is_error"):
            await self.close_stdin()
            return
        more = await self.stop.next_message(str(line.get("result") or ""))
        if more:
            self.final = None
            await self._say(more)
            return
        await self.close_stdin()

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
                failure_reason=failure_of(final),
                error=error_text(final),
                exit_code=exit_code,
            )
        return Outcome(status=RunState.SUCCEEDED, summary=str(final.get("result") or ""), exit_code=exit_code)
