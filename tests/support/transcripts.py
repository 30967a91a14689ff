"""Transcripts to render: one event of every kind the timeline knows (and one it does not), the
way the runtimes record them, stored with `transcript.append` on a task's first run."""

from typing import Any

from sqlalchemy import select

from forge.db import Database
from forge.settings import Settings
from tasks.core import transcript
from tasks.core.models import Run, Task
from tasks.core.transcript import (
    Assistant,
    Notice,
    Output,
    Pending,
    Prompt,
    Question,
    Summary,
    System,
    ToolCall,
    ToolResult,
)

COMMAND = 'for f in *.txt; do echo "$f" | tr a-z A-Z; done && printf \'%s\\n\' "tab\\there"'
WRITTEN = 'def greet(name):\n    return f"hello {name}"\n'


def every_kind(run_id: int) -> list[Pending]:
    policy = {
        "event": "pre_tool_use",
        "decision": "deny",
        "delivery_id": "d1",
        "reason": "no network tools here",
        "endpoints": [
            {"url": "http://127.0.0.1:9/policy", "result": "ok", "decision": "deny", "status": 200, "latency_ms": 12.5}
        ],
    }
    events: list[Any] = [
        ("prompt", Prompt(text="Fix the <b>greeting</b>\n> quoted", source="start", author="ana")),
        ("system", System(phase="claimed", text="claimed by worker w1", duration_ms=3)),
        ("system", System(phase="workspace", text="workspace prepared", duration_ms=420)),
        ("system", System(phase="sandbox", text="sandbox started", duration_ms=2300)),
        ("assistant", Assistant(text="I will **fix** it.\n\n<script>alert(1)</script><img src=x onerror=alert(2)>")),
        ("tool_call", ToolCall(id="c1", name="bash", input={"command": COMMAND})),
        ("tool_result", ToolResult(id="c1", name="bash", output="exit code 0\nA.TXT\ntab\there\n")),
        ("tool_call", ToolCall(id="c2", name="write_file", input={"path": "greet.py", "content": WRITTEN})),
        ("tool_result", ToolResult(id="c2", name="write_file", output="wrote 44 bytes to greet.py")),
        (
            "tool_call",
            ToolCall(
                id="c3", name="edit_file", input={"path": "old.txt", "old_string": "two\n", "new_string": "TWO\n"}
            ),
        ),
        ("tool_result", ToolResult(id="c3", name="edit_file", output="edited old.txt", is_error=False)),
        ("system", System(phase="policy", text="pre_tool_use: deny", detail=policy)),
        ("stdout", Output(text="line one\n")),
        ("stdout", Output(text="line two\n")),
        ("stderr", Output(text="warning: careful\n")),
        ("stdout", Output(text="".join(f"row {i}\n" for i in range(60)))),
        ("notice", Notice(text="no activity for 30 s", level="warning")),
        ("question", Question(text="Which name?", tool_call_id="c9")),
        ("summary", Summary(text="Fixed the *greeting*.")),
        (
            "system",
            System(
                phase="snapshot", text="snapshot abc on agent/1", duration_ms=80, detail={"changed_files": ["greet.py"]}
            ),
        ),
    ]
    return [Pending(kind=k, payload=p, run_id=run_id) for k, p in events]


async def record(db: Database, number: int, events: list[Pending] | None = None) -> int:
    """Store `events` (default: `every_kind`) on task `number`'s first run; returns the last seq."""
    async with db.session(write=True) as s:
        task = (await s.execute(select(Task).where(Task.number == number))).scalar_one()
        run = (await s.execute(select(Run).where(Run.task_id == task.id).order_by(Run.seq))).scalars().first()
        assert run is not None
        seqs = await transcript.append(s, task.id, events if events is not None else every_kind(run.id))
        return seqs[-1]


async def record_unknown_kind(db: Database, number: int) -> None:
    """An event of a kind this page was not written for (a newer producer's), stored raw."""
    from tasks.core.models import TranscriptEvent

    async with db.session(write=True) as s:
        task = (await s.execute(select(Task).where(Task.number == number))).scalar_one()
        task.last_seq += 1
        s.add(
            TranscriptEvent(
                task_id=task.id,
                seq=task.last_seq,
                run_id=None,
                at=task.updated_at,
                kind="model_call",
                schema_version=1,
                payload={"model": "m-1", "input_tokens": 1200, "output_tokens": 80, "request": {"stream": True}},
            )
        )


async def record_on_server(settings: Settings, number: int) -> int:
    """`record` against a running server's database (browser tests)."""
    db = Database(settings.effective_database_url)
    try:
        last = await record(db, number)
        await record_unknown_kind(db, number)
        return last
    finally:
        await db.dispose()
