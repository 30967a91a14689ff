"""Transcripts to render: one event of every kind the timeline knows (and one it does not), the
way the runtimes record them, stored with `transcript.append` on a task's first run."""

from typing import Any

from sqlalchemy import select

from forge.core.settings import Settings
from forge.db.engine import Database
from tasks.core import transcript
from tasks.core.models import Run, Task
from tasks.core.transcript import (
    Assistant,
    ModelCall,
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


# A pooled sandbox's container name, as long as they come (the page shortens it).
CONTAINER = "forgehand-pool-3f9c2a7d1e4b-t-" + b"9d2b7c1e4f3a4e5b8c6d7e8f9a0b1c2d".hex() + "-r-" + b"0b6f".hex()


def every_kind(run_id: int) -> list[Pending]:
    """One event of each kind, in the order a builtin run records them (25 events; the 7th is the
    bash call `c1`, its policy decisions around its result)."""
    deny = {
        "event": "pre_tool_use",
        "decision": "deny",
        "delivery_id": "d1",
        "reason": "no network tools here",
        "endpoints": [
            {"url": "http://127.0.0.1:9/policy", "result": "ok", "decision": "deny", "status": 200, "latency_ms": 12.5}
        ],
    }  # no tool_use_id: recorded before decisions named their call

    def allow(event: str) -> dict[str, Any]:
        endpoint = {"url": "http://127.0.0.1:9/policy", "result": "ok", "decision": "allow", "status": 200}
        return {
            "event": event,
            "decision": "allow",
            "delivery_id": f"d-{event}",
            "tool_use_id": "c1",
            "endpoints": [{**endpoint, "latency_ms": 3.0}],
        }

    blocked = (
        "error: an external policy blocked this web_fetch call; it was not executed and retrying it will be "
        "denied again. Explain this to the user. Reason: no network tools here"
    )
    # As the gateway records a call: `ttfb_ms` null, `error` empty (nothing to show for either).
    model = ModelCall(
        provider="anthropic", model="claude-test", status=200, input_tokens=1200, output_tokens=80, latency_ms=850
    )
    events: list[Any] = [
        ("prompt", Prompt(text="Fix the <b>greeting</b>\n> quoted", source="start", author="ana")),
        ("system", System(phase="claimed", text="claimed by worker w1", duration_ms=3)),
        ("system", System(phase="workspace", text="workspace prepared", duration_ms=420)),
        (
            "system",
            System(
                phase="sandbox", text=f"sandbox {CONTAINER} started", duration_ms=2300, detail={"container": CONTAINER}
            ),
        ),
        ("model_call", model),
        ("assistant", Assistant(text="I will **fix** it.\n\n<script>alert(1)</script><img src=x onerror=alert(2)>")),
        ("tool_call", ToolCall(id="c1", name="bash", input={"command": COMMAND})),
        ("system", System(phase="policy", text="pre_tool_use: allow", detail=allow("pre_tool_use"))),
        ("tool_result", ToolResult(id="c1", name="bash", output="exit code 0\nA.TXT\ntab\there\n")),
        ("system", System(phase="policy", text="post_tool_use: allow", detail=allow("post_tool_use"))),
        ("tool_call", ToolCall(id="c2", name="write_file", input={"path": "greet.py", "content": WRITTEN})),
        ("tool_result", ToolResult(id="c2", name="write_file", output="wrote 44 bytes to greet.py")),
        (
            "tool_call",
            ToolCall(
                id="c3", name="edit_file", input={"path": "old.txt", "old_string": "two\n", "new_string": "TWO\n"}
            ),
        ),
        ("tool_result", ToolResult(id="c3", name="edit_file", output="edited old.txt", is_error=False)),
        ("tool_call", ToolCall(id="c4", name="web_fetch", input={"url": "https://example.com/"})),
        ("system", System(phase="policy", text="pre_tool_use: deny", detail=deny)),
        ("tool_result", ToolResult(id="c4", name="web_fetch", output=blocked, is_error=True)),
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


# What Claude Code tells its model about a call forgehand interrupted for a person (its tool result,
# `is_error` true): a parked approval and a question alike.
CLAUDE_HELD = (
    "The user doesn't want to proceed with this tool use. The tool use was rejected (eg. if it was a file edit, "
    "the new_string was NOT written to the file). STOP what you are doing and wait for the user to tell you how "
    "to proceed."
)
PARKED_ID = "toolu_01Park"
PARKED_COMMAND = "rm -rf build\nmake all"
ASKED_ID = "toolu_01Ask"
ASK_REASON = "shell commands need a person"


def parked_call(run_id: int) -> list[Pending]:
    """A claude-code run whose Bash call a policy consumer answered `ask`: the call, the decision,
    the CLI's tool result for the interrupted call, the run's end."""
    ask = {
        "event": "pre_tool_use",
        "decision": "ask",
        "delivery_id": "d-ask",
        "tool_use_id": PARKED_ID,
        "reason": ASK_REASON,
        "endpoints": [
            {"url": "http://127.0.0.1:9/policy", "result": "ok", "decision": "ask", "status": 200, "latency_ms": 8.0}
        ],
    }
    events: list[Any] = [
        ("tool_call", ToolCall(id=PARKED_ID, name="Bash", input={"command": PARKED_COMMAND}, kind="execute")),
        ("system", System(phase="policy", text="pre_tool_use: ask", detail=ask)),
        ("tool_result", ToolResult(id=PARKED_ID, name="Bash", output=CLAUDE_HELD, is_error=True)),
    ]
    return [Pending(kind=k, payload=p, run_id=run_id) for k, p in events]


def asked_question(run_id: int) -> list[Pending]:
    """A claude-code run that asked the person through forgehand's back-channel: the MCP tool call,
    the CLI's result for the interrupted call, and the question (recorded as the run ends, naming
    no call: the CLI does not say which call asked)."""
    question = {"question": "Which colour?", "options": ["red", "blue"]}
    events: list[Any] = [
        ("tool_call", ToolCall(id=ASKED_ID, name="mcp__forgehand__ask_user", input=question, kind="other")),
        ("tool_result", ToolResult(id=ASKED_ID, name="mcp__forgehand__ask_user", output=CLAUDE_HELD, is_error=True)),
        ("question", Question(text="Which colour?", options=["red", "blue"])),
    ]
    return [Pending(kind=k, payload=p, run_id=run_id) for k, p in events]


async def park(db: Database, number: int) -> str:
    """Block task `number` on `parked_call` (recorded on its first run) as the runtime would: a
    pending approval of the Bash call. Returns the approval's id."""
    from datetime import timedelta

    from forge.db.engine import utcnow
    from tasks.core.models import Approval
    from tasks.core.policy import input_hash

    async with db.session(write=True) as s:
        task = (await s.execute(select(Task).where(Task.number == number))).scalar_one()
        run = (await s.execute(select(Run).where(Run.task_id == task.id).order_by(Run.seq))).scalars().first()
        assert run is not None
        await transcript.append(s, task.id, parked_call(run.id))
        tool_input = {"command": PARKED_COMMAND}
        approval = Approval(
            task_id=task.id,
            repo_id=task.repo_id,
            run_id=run.id,
            tool_use_id=PARKED_ID,
            tool_name="Bash",
            tool_input=tool_input,
            input_hash=input_hash(tool_input),
            reason=ASK_REASON,
            requested_by="http://127.0.0.1:9/policy",
            expires_at=utcnow() + timedelta(hours=1),
        )
        s.add(approval)
        run.state = task.state = "blocked"
        await s.flush()
        return approval.uuid


async def ask(db: Database, number: int) -> None:
    """Block task `number` on `asked_question` (recorded on its first run), as the runtime would."""
    async with db.session(write=True) as s:
        task = (await s.execute(select(Task).where(Task.number == number))).scalar_one()
        run = (await s.execute(select(Run).where(Run.task_id == task.id).order_by(Run.seq))).scalars().first()
        assert run is not None
        await transcript.append(s, task.id, asked_question(run.id))
        task.question, task.question_options = "Which colour?", ["red", "blue"]
        run.state = task.state = "blocked"


async def record(db: Database, number: int, events: list[Pending] | None = None) -> int:
    """Store `events` (default: `every_kind`) on task `number`'s first run; returns the last seq."""
    async with db.session(write=True) as s:
        task = (await s.execute(select(Task).where(Task.number == number))).scalar_one()
        run = (await s.execute(select(Run).where(Run.task_id == task.id).order_by(Run.seq))).scalars().first()
        assert run is not None
        seqs = await transcript.append(s, task.id, events if events is not None else every_kind(run.id))
        return seqs[-1]


async def record_unknown_kind(db: Database, number: int) -> None:
    """An event of a kind this page was not written for (a newer producer's), stored raw; its
    empty fields say nothing."""
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
                kind="cache_report",
                schema_version=1,
                payload={"hits": 1200, "misses": 80, "evicted": None, "note": "", "request": {"stream": True}},
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
