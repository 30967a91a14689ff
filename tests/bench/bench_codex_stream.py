"""Codex's stream normalisation against the builtin runtime's transcript path, in one run.

A scripted Codex `exec --json` stream of 10,000 events (the shapes 0.171.0 prints: command
executions started and completed, file changes, agent messages, turn usage) is ingested the way the
codex runtime does it (the bytes read from the pipe 64 KiB at a time and split into lines by the
process's `LineSplitter`, the lines its `StdoutReader` has queued kept for the raw artefact, decoded,
normalised by `StreamState`, then stored together with one call) into
the real `TranscriptWriter` (redaction, batching, SQLite, the live hub); the same number of
transcript events, built directly as the builtin runtime builds them, go through the
same writer one `emit` at a time, as the builtin loop emits them. The passes alternate, builtin,
codex, codex, builtin, twice (each into a task of its own), so neither path always meets the bigger
table or the warmer process; each path's figure is over its four passes. Printed: events per second
for each, the ratio (goal: codex >= builtin, ratio >= 1.0), the ingesting thread's CPU per event
(the normalisation's own cost, which the other threads' noise does not blur),
the live readers' lag (event emitted -> the hub woke a listener) and the lag of SSE clients
following each task (emitted -> received, the tasks bench's figure; the app served in this
process, the clients in their own) for both. Figures are
printed, never asserted as wall-clock limits; a lost event fails.

Run: `make bench` (or `pytest -q -s tests/bench/bench_codex_stream.py -o python_files='bench_*.py'`)."""

import asyncio
import itertools
import json
import statistics
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

from sqlalchemy import func, select

from forge.core.settings import load_settings, prepare_data_dir
from forge.db.engine import Database
from sandbox.process import DEFAULT_LINE_CAP, LineSplitter
from tasks.core.capping import HeadTail
from tasks.core.live import LiveHub
from tasks.core.models import TranscriptEvent
from tasks.core.redaction import Redactor
from tasks.core.transcript import Assistant, System, ToolCall, ToolResult
from tasks.core.writer import TranscriptWriter
from tasks.run.runtimes.cli_lines import StdoutReader
from tasks.run.runtimes.codex.stream import StreamState
from tests.support.sse_lag import Served, figures, served, subscribed
from tests.support.tasks import seed, start_task

EVENTS = 10_000
ORDER = ("builtin", "codex", "codex", "builtin") * 2  # alternating: each path meets each position alike
CLIENTS = 10  # SSE clients per pass, in a process of their own (tests/support/sse_lag.py)


def codex_lines(events: int) -> list[bytes]:
    """Raw stdout lines that normalise into exactly `events` transcript events."""
    lines = [json.dumps({"type": "thread.started", "thread_id": "01a2-bench"}).encode(), b'{"type":"turn.started"}']
    made = 1  # thread.started -> one system event
    i = 0
    while made < events - 1:
        item = f"item_{i}"
        if i % 3 == 0 and events - 1 - made >= 2:
            cmd = {"id": item, "type": "command_execution", "command": f"/bin/bash -lc 'echo {i}'"}
            lines.append(json.dumps({"type": "item.started", "item": {**cmd, "status": "in_progress"}}).encode())
            done = {**cmd, "aggregated_output": f"{i}\n" * 4, "exit_code": 0, "status": "completed"}
            lines.append(json.dumps({"type": "item.completed", "item": done}).encode())
            made += 2
        elif i % 3 == 1 and events - 1 - made >= 2:
            change = {"id": item, "type": "file_change", "changes": [{"path": f"/workspace/f{i}.txt", "kind": "add"}]}
            lines.append(json.dumps({"type": "item.completed", "item": {**change, "status": "completed"}}).encode())
            made += 2
        else:
            message = {"id": item, "type": "agent_message", "text": f"step {i} done; moving on to the next one"}
            lines.append(json.dumps({"type": "item.completed", "item": message}).encode())
            made += 1
        i += 1
    while made < events - 1:
        lines.append(
            json.dumps({"type": "item.completed", "item": {"id": "x", "type": "agent_message", "text": "."}}).encode()
        )
        made += 1
    usage = {"input_tokens": 100, "cached_input_tokens": 0, "output_tokens": 10, "reasoning_output_tokens": 0}
    lines.append(json.dumps({"type": "turn.completed", "usage": usage}).encode())
    return lines


def builtin_payloads(events: int) -> Iterator[tuple[str, Any]]:
    """The builtin runtime's events for the same work: calls, results, messages, each built when it is
    emitted (as the runtime builds its structs at emit time; bench_acp does the same)."""

    def endless() -> Iterator[tuple[str, Any]]:
        yield "system", System(phase="runtime", text="runtime builtin started")
        for i in itertools.count():
            if i % 3 == 0:
                yield "tool_call", ToolCall(id=f"c{i}", name="bash", input={"command": f"echo {i}"}, kind="execute")
                yield "tool_result", ToolResult(id=f"c{i}", name="bash", output=f"{i}\n" * 4)
            elif i % 3 == 1:
                yield "tool_call", ToolCall(id=f"c{i}", name="write_file", input={"path": f"f{i}.txt"}, kind="edit")
                yield "tool_result", ToolResult(id=f"c{i}", name="write_file", output=f"add /workspace/f{i}.txt")
            else:
                yield "assistant", Assistant(text=f"step {i} done; moving on to the next one")

    return itertools.islice(endless(), events)


class PipedStdout:
    """The CLI process as the runtime's StdoutReader sees it (SandboxProcess.stdout_batches): stdout
    read from the pipe 64 KiB at a time, split into lines by the process's own LineSplitter, each
    read's lines handed over together (the loop runs other work between two reads)."""

    def __init__(self, lines: list[bytes]) -> None:
        self.data = b"".join(raw + b"\n" for raw in lines)

    async def stdout_batches(self) -> AsyncIterator[list[bytes]]:
        splitter = LineSplitter(DEFAULT_LINE_CAP)
        for at in range(0, len(self.data), 64 * 1024):
            if lines := splitter.feed(self.data[at : at + 64 * 1024]):
                yield lines
            await asyncio.sleep(0)
        if (last := splitter.flush()) is not None:
            yield [last]


class Woken:
    """A live reader: when the hub woke it for the task, against when each event was emitted."""

    def __init__(self, hub: LiveHub, task_id: int) -> None:
        self.task_id = task_id
        self.times: list[float] = []
        hub.listen(self._on)

    def _on(self, task_id: int) -> None:
        if task_id == self.task_id:
            self.times.append(time.perf_counter())


def lags(emitted: list[float], woken: list[float]) -> list[float]:
    """Per event: emitted -> the first wake-up at or after it."""
    out, j = [], 0
    for at in emitted:
        while j < len(woken) and woken[j] < at:
            j += 1
        if j < len(woken):
            out.append(woken[j] - at)
    return out


async def run_bench(tmp_path: Path) -> None:
    settings = prepare_data_dir(
        load_settings(
            environ={}, data_dir=tmp_path / "data", database_url=f"sqlite+aiosqlite:///{tmp_path / 'bench.db'}",
            base_url="http://bench.local", log_level="warning", run_worker=False,
        )
    )  # fmt: skip
    from forge.db.migrate import upgrade_async

    await upgrade_async(settings.effective_database_url)
    token, _ = await seed(settings)
    db = Database(settings.effective_database_url)
    try:
        ids = [(await start_task(settings, db, goal=name))[:2] for name in ORDER]

        async def ingest(
            app: Served, task_id: int, number: int, feed: Any
        ) -> tuple[float, float, list[float], list[float], list[float]]:
            async with db.session() as s:
                after = int(await s.scalar(select(func.max(TranscriptEvent.seq)).where(
                    TranscriptEvent.task_id == task_id)) or 0)  # fmt: skip
            async with subscribed(app.url, token, number, clients=CLIENTS, kinds={"*"}, expect=EVENTS,
                                  after=after) as sse:  # fmt: skip
                writer = TranscriptWriter(db, app.hub, task_id, None, Redactor(["sk-bench-secret-0123456789"]))
                woken = Woken(app.hub, task_id)
                emitted: list[float] = []
                writer.start()
                t0, cpu0 = time.perf_counter(), time.thread_time()
                await feed(writer, emitted)
                await writer.close()
                took, cpu = time.perf_counter() - t0, time.thread_time() - cpu0
            return took, cpu, emitted, woken.times, sse

        raw_lines = codex_lines(EVENTS)

        async def codex_feed(writer: TranscriptWriter, emitted: list[float]) -> None:
            # The codex runtime's path (CodexTurn.run): the lines its reader has queued, normalised
            # together, stored with one call (RunContext.emit_all -> the writer's emit_many).
            state, kept = StreamState("0.171.0"), HeadTail(8 * 1024 * 1024)
            reader = StdoutReader(PipedStdout(raw_lines))
            try:
                while (lines := await reader.next_lines(10.0)) is not None:
                    events = state.feed_lines(lines, kept)
                    await writer.emit_many(events)  # type: ignore[arg-type]
                    emitted += [time.perf_counter()] * len(events)
            finally:
                await reader.close()

        async def builtin_feed(writer: TranscriptWriter, emitted: list[float]) -> None:
            for kind, payload in builtin_payloads(EVENTS):
                await writer.emit(kind, payload)  # type: ignore[arg-type]
                emitted.append(time.perf_counter())

        feeds = {"builtin": builtin_feed, "codex": codex_feed}
        took: dict[str, float] = {"builtin": 0.0, "codex": 0.0}
        cpu: dict[str, float] = {"builtin": 0.0, "codex": 0.0}
        woken_lags: dict[str, list[float]] = {"builtin": [], "codex": []}
        sse_lags: dict[str, list[float]] = {"builtin": [], "codex": []}
        passes: list[str] = []
        with served(settings) as app:
            for name, (task_id, number) in zip(ORDER, ids, strict=True):
                spent, spent_cpu, emitted, woken, sse = await ingest(app, task_id, number, feeds[name])
                async with db.session() as s:
                    stored = await s.scalar(select(func.count()).where(TranscriptEvent.task_id == task_id))
                # (the task's own start events are stored too)
                assert len(emitted) == EVENTS and stored is not None and stored >= EVENTS, (name, len(emitted), stored)
                assert len(sse) == CLIENTS * EVENTS, (name, len(sse))  # every SSE client had every event
                took[name] += spent
                cpu[name] += spent_cpu
                woken_lags[name] += lags(emitted, woken)
                sse_lags[name] += sse
                passes.append(f"{name} {EVENTS / spent:,.0f}")
        ratio = took["builtin"] / took["codex"]
        print(f"\n{EVENTS:,} transcript events a pass, stored by the real TranscriptWriter (SQLite, live hub);")
        print(f"  passes in order (events/s): {', '.join(passes)}")
        runs = ORDER.count("codex")
        for name in ("builtin", "codex"):
            lag = woken_lags[name]
            print(
                f"  {name:8s}: {runs * EVENTS / took[name]:,.0f} events/s over its {runs} passes ({took[name]:.2f} s;"
                f" the ingesting thread's CPU {cpu[name] / (runs * EVENTS) * 1e6:.1f} us an event);"
                f" live readers' lag, emitted -> woken: median {statistics.median(lag) * 1000:.1f} ms,"
                f" p95 {statistics.quantiles(lag, n=20)[-1] * 1000:.1f} ms, max {max(lag) * 1000:.1f} ms"
                f"\n            {CLIENTS} SSE clients' lag, emitted -> received: {figures(sse_lags[name])}"
            )
        verdict = "" if ratio >= 1.0 else "  -- MISSES THE GOAL"
        print(f"  codex / builtin throughput: {ratio:.2f}x (goal >= 1.0x){verdict}")
    finally:
        await db.dispose()


def test_bench_codex_stream(tmp_path: Path) -> None:
    asyncio.run(run_bench(tmp_path))
