"""ACP normalisation keeps up: a scripted ACP agent (a real process, tests/support/acp_agent.py)
streams 10,000 `session/update` notifications (2,500 tool calls, each a message chunk, the call,
its start and its completion) through the acp runtime into a real TranscriptWriter on SQLite,
against the builtin runtime's transcript path measured in the same run: the same 7,500 typed
events (assistant, tool_call, tool_result) emitted straight into a TranscriptWriter, as the
builtin loop emits them, each result followed by its `post_tool_use` as the loop sends it (the
acp pass sends one for each call too). During each pass SSE clients follow the task's live
transcript (the real app served in this process, tests/support/sse_lag.py) and the lag per
event, emitted -> received, is printed for both paths (the tasks bench's figure). The passes
alternate (builtin, acp, acp, builtin, twice), each into a task of its own; each path's figure
is over its four passes. Figures are printed (ratio in one run), never asserted as limits;
losing an event fails.

Run: `pytest -q -s tests/bench/bench_acp.py -o python_files='bench_*.py'`."""

import sys
import time
from pathlib import Path
from typing import Any

from sqlalchemy import func, select

from forge.core.settings import Settings
from forge.db.engine import Database
from tasks.core.agent_registry import AcpAgent
from tasks.core.capping import TOOL_OUTPUT_CAP, cap_text
from tasks.core.models import TranscriptEvent
from tasks.core.redaction import Redactor
from tasks.core.transcript import Assistant, Kind, Payload, System, ToolCall, ToolResult
from tasks.core.writer import TranscriptWriter
from tasks.run.runtimes.acp.runtime import AcpAgentRuntime
from tasks.run.runtimes.policy_steps import after_tool
from tests.support.acp_agent import argv
from tests.support.claude_host import HostSandbox, ScriptedGate, host_context
from tests.support.sse_lag import figures, served, subscribed
from tests.support.tasks import seed, start_task

CALLS = 2_500  # x 4 updates = 10,000 notifications -> 7,500 transcript events


def scenario() -> dict[str, Any]:
    return {"turns": [[{"calls": CALLS}]]}


CLIENTS = 10  # SSE clients per pass, in a process of their own
ORDER = ("builtin", "acp", "acp", "builtin") * 2  # alternating: each path meets each position alike
SHOWN = {"assistant", "tool_call", "tool_result"}


async def stored(db: Database, task_id: int) -> int:
    async with db.session() as s:
        return int((await s.execute(select(func.count()).where(TranscriptEvent.task_id == task_id))).scalar_one())


async def builtin_pass(writer: TranscriptWriter, box: Path) -> None:
    """The builtin runtime's path: typed events into the writer, as its loop emits them, and a
    call's result followed by its `post_tool_use` (tasks/run/runtimes/builtin/runtime.py `_run_tool`), as
    the acp pass sends one for each call that ran."""
    ctx = host_context(HostSandbox(box, base_url=""), ScriptedGate(), writer.emit)  # type: ignore[arg-type]
    for i in range(CALLS):
        await writer.emit("assistant", Assistant(text=f"step {i}"))
        call = ToolCall(id=f"call-{i}", name="Read", input={"path": f"/workspace/f{i}.txt"}, kind="read")
        await writer.emit("tool_call", call)
        text, omitted = cap_text(f"line {i}\n", TOOL_OUTPUT_CAP)
        await writer.emit("tool_result", ToolResult(id=call.id, name="Read", output=text, omitted_bytes=omitted))
        await after_tool(ctx, tool_use_id=call.id, tool_name="Read", output=text, is_error=False)


async def acp_pass(writer: TranscriptWriter, box: Path) -> float:
    """The acp runtime: the agent's process, JSON-RPC, normalisation, post_tool_use, the writer.
    Returns when the stream began: the runtime's "session started" event, emitted as it sends
    `session/prompt` (the agent's start, `initialize` and `session/new` are behind it)."""
    runtime = AcpAgentRuntime(AcpAgent(name="bench", command=argv(scenario(), python=sys.executable), provider="none"))
    began: list[float] = []

    async def emit(kind: Kind, payload: Payload) -> None:
        if not began and isinstance(payload, System) and payload.phase == "agent":
            began.append(time.perf_counter())
        await writer.emit(kind, payload)

    ctx = host_context(HostSandbox(box, base_url=""), ScriptedGate(), emit)  # type: ignore[arg-type]
    ctx.emit_many = writer.emit_many  # as the worker's run context has it (tasks/run/execution.py)
    outcome = await runtime.run(ctx)
    assert outcome.status.value == "succeeded", outcome
    return began[0]


async def test_bench_acp_ingest(settings: Settings, db: Database, tmp_path: Path) -> None:
    token, _ = await seed(settings)
    tasks = [await start_task(settings, db, goal=name) for name in ORDER]
    took: dict[str, float] = {"builtin": 0.0, "acp": 0.0, "stream": 0.0}
    events: dict[str, int] = {"builtin": 0, "acp": 0}
    sse: dict[str, list[float]] = {"builtin": [], "acp": []}
    passes: list[str] = []
    with served(settings) as app:
        for i, (name, (task_id, number, run_id)) in enumerate(zip(ORDER, tasks, strict=True)):
            async with subscribed(app.url, token, number, clients=CLIENTS, kinds=SHOWN, expect=3 * CALLS) as lags:
                before = await stored(db, task_id)
                writer = TranscriptWriter(db, app.hub, task_id, run_id, Redactor([]))
                writer.start()
                t0 = time.perf_counter()
                box = tmp_path / f"box{i}"
                began = t0
                if name == "builtin":
                    await builtin_pass(writer, box)
                else:
                    began = await acp_pass(writer, box)
                await writer.close()
                ended = time.perf_counter()
                spent = ended - t0
                took["stream"] += ended - began if name == "acp" else 0.0
                made = await stored(db, task_id) - before
            kinds = [e for e in await _kinds(db, task_id) if e in SHOWN]
            assert len(kinds) >= 3 * CALLS  # nothing lost
            assert len(lags) == CLIENTS * 3 * CALLS  # every client had every event
            took[name] += spent
            events[name] += made
            sse[name] += lags
            passes.append(f"{name} {made / spent:,.0f}")
    assert events["builtin"] == ORDER.count("builtin") * 3 * CALLS
    rate = {"builtin": events["builtin"] / took["builtin"], "acp": events["acp"] / took["acp"]}
    stream = events["acp"] / took["stream"]
    passes_each = ORDER.count("acp")
    print(
        f"\nACP ingest: {4 * CALLS:,} session/update notifications a pass"
        f" -> {events['acp'] // passes_each:,} transcript events"
        f" (with {CALLS:,} post_tool_use dispatches);"
        f" passes alternate, in order (events/s, whole pass): {', '.join(passes)}"
        f"\nacp, the stream (session/prompt sent -> every event stored): {stream:,.0f} events/s"
        f" over its {passes_each} passes ({took['stream']:.2f} s)"
        f"\nacp, the whole pass (the agent's start, initialize and session/new too): {rate['acp']:,.0f} events/s"
        f" ({took['acp']:.2f} s)"
        f"\nbuiltin transcript path: {rate['builtin']:,.0f} events/s"
        f" over its {passes_each} passes ({took['builtin']:.2f} s)"
        f"\nratio, the stream (acp / builtin events per second): {stream / rate['builtin']:.2f}"
        f"{'' if stream >= rate['builtin'] else '  -- slower than the builtin path'}"
        f"\nratio, the whole pass: {rate['acp'] / rate['builtin']:.2f}"
        f"\n{CLIENTS} SSE clients' lag, emitted -> received ({3 * CALLS:,} events each a pass):"
        f"\n  acp:     {figures(sse['acp'])}"
        f"\n  builtin: {figures(sse['builtin'])}"
    )


async def _kinds(db: Database, task_id: int) -> list[str]:
    async with db.session() as s:
        return list((await s.execute(select(TranscriptEvent.kind).where(TranscriptEvent.task_id == task_id))).scalars())
