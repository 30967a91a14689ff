"""The `command` runtime: one command line in the sandbox; its output is the transcript, exit 0 is success.

It needs no model, which makes it the runtime of the `make run` demo and of CI checks."""

import codecs

from forge.core.text import code_block, code_span, plural
from sandbox import ExecResult, OutputChunk
from tasks.core.schemas import argv_of, command_text
from tasks.core.states import FailureReason, RunState
from tasks.core.transcript import Notice, Output
from tasks.run.runtimes.base import Outcome, RunContext


class CommandRuntime:
    name = "command"

    def needs_model(self) -> bool:
        return False

    async def run(self, ctx: RunContext) -> Outcome:
        argv = argv_of(ctx.command)
        if ctx.prompt and ctx.kind in ("message", "answer", "review"):
            what = "change request" if ctx.kind == "review" else ctx.kind
            await ctx.emit(
                "notice",
                Notice(
                    text=f"the command runtime has no conversation: the {what} is in $FORGEHAND_PROMPT, "
                    "the command runs again"
                ),
            )
        result = await self._stream(ctx, argv)
        ctx.turns = 1
        if result.truncated_bytes:
            await ctx.emit(
                "notice",
                Notice(text=f"output over the cap: {plural(result.truncated_bytes, 'byte')} not kept", level="warning"),
            )
        return _outcome(ctx, result)

    async def _stream(self, ctx: RunContext, argv: list[str]) -> ExecResult:
        """Run the command, its output emitted as it comes (decoded as UTF-8 across chunks)."""
        decoders = {
            "stdout": codecs.getincrementaldecoder("utf-8")("replace"),
            "stderr": codecs.getincrementaldecoder("utf-8")("replace"),
        }
        env = {"FORGEHAND_TASK_GOAL": ctx.goal, "FORGEHAND_PROMPT": ctx.prompt}
        async with ctx.sandbox.stream(
            argv, env=env, timeout=ctx.limits.tool_timeout, output_cap=ctx.limits.output_cap, queue_chunks=64
        ) as running:
            chunk: OutputChunk
            async for chunk in running:
                text = decoders[chunk.stream].decode(chunk.data)
                if text:
                    await ctx.emit(chunk.stream, Output(text=text))
        for stream, decoder in decoders.items():
            rest = decoder.decode(b"", final=True)
            if rest:
                await ctx.emit(stream, Output(text=rest))  # type: ignore[arg-type]
        return running.result


def _outcome(ctx: RunContext, result: ExecResult) -> Outcome:
    """How the run ends, from how the command did."""
    if result.oom_killed:
        return Outcome(
            status=RunState.FAILED,
            failure_reason=FailureReason.OOM,
            error="the command ran out of memory",
            exit_code=result.exit_code,
        )
    if result.timed_out:
        # The sandbox cuts every command at whatever is left of its wall clock: a cut well
        # before the per-command limit is the run's wall-clock limit, and is said as such.
        hit_wall_clock = result.duration < ctx.limits.tool_timeout - 1
        return Outcome(
            status=RunState.FAILED,
            failure_reason=FailureReason.TIMEOUT,
            error="the run passed its wall-clock limit"
            if hit_wall_clock
            else f"the command did not finish within {ctx.limits.tool_timeout:g} s",
            exit_code=result.exit_code,
        )
    if result.exit_code == 0:
        return Outcome(status=RunState.SUCCEEDED, summary=success_summary(ctx.command), exit_code=0)
    return Outcome(
        status=RunState.FAILED,
        failure_reason=FailureReason.EXIT_CODE,
        error=f"the command exited with status {result.exit_code}",
        exit_code=result.exit_code,
    )


def success_summary(command: str | list[str] | None) -> str:
    """The run's summary (markdown): the command as written, a command of several lines as a
    block, so that its lines stay lines wherever the summary is shown."""
    shown = command_text(command).strip("\n")
    if "\n" in shown:
        return f"The command exited 0:\n\n{code_block(shown)}"
    return f"{code_span(shown)} exited 0"
