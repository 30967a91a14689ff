"""Transcripts: typed payloads and the append path (redaction: redaction.py; output caps: capping.py).

Each event gets a per-task `seq` from the counter on the task row, incremented with
`UPDATE ... RETURNING` in the transaction that inserts the event. The row lock (PostgreSQL) or
the database write lock (SQLite, BEGIN IMMEDIATE) is held until commit, so events of one task
commit in `seq` order: a reader resuming after N can never miss a lower number committed later.
The public contract is docs/transcript.md.
"""

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Literal, TypeVar

import msgspec
from sqlalchemy import Table, Text, cast, insert, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from forge.db.engine import utcnow
from tasks.core.models import Run, Task, TranscriptEvent

SCHEMA_VERSION = 1

Kind = Literal[
    "prompt",
    "assistant",
    "tool_call",
    "tool_result",
    "stdout",
    "stderr",
    "notice",
    "system",
    "summary",
    "question",
    "model_call",
    "egress_blocked",
    "policy_bypass",
    "progress",
    "subtask",
    "tool_run",
]
KINDS: tuple[str, ...] = Kind.__args__  # type: ignore[attr-defined]


class Prompt(msgspec.Struct, kw_only=True, tag="prompt"):
    text: str
    source: str = "start"  # start, message, answer, retry, review
    author: str = ""


class Assistant(msgspec.Struct, kw_only=True, tag="assistant"):
    text: str
    # A CLI agent's subagent speaking: the id of the tool call that started it ("" = the agent).
    parent_id: str = ""


class ToolCall(msgspec.Struct, kw_only=True, tag="tool_call"):
    id: str
    name: str
    input: Any = None
    # What the tool does (read, edit, execute, search, fetch, think, switch_mode, other); "" when
    # the runtime does not say (the builtin runtime's own tools).
    kind: str = ""
    parent_id: str = ""


class ToolResult(msgspec.Struct, kw_only=True, tag="tool_result"):
    id: str
    name: str
    output: str
    is_error: bool = False
    omitted_bytes: int = 0
    parent_id: str = ""


class Output(msgspec.Struct, kw_only=True, tag="output"):
    text: str
    omitted_bytes: int = 0


class Notice(msgspec.Struct, kw_only=True, tag="notice"):
    text: str
    level: Literal["info", "warning", "error"] = "info"


class System(msgspec.Struct, kw_only=True, tag="system"):
    phase: str
    text: str
    duration_ms: int | None = None
    detail: dict[str, Any] = msgspec.field(default_factory=dict)


class Summary(msgspec.Struct, kw_only=True, tag="summary"):
    text: str
    # The agent reported it (the back-channel's report_summary), not taken from its last words.
    reported: bool = False


class Question(msgspec.Struct, kw_only=True, tag="question"):
    text: str
    tool_call_id: str = ""
    options: list[str] = msgspec.field(default_factory=list)  # answers the agent offered


class Progress(msgspec.Struct, kw_only=True, tag="progress"):
    """The agent's own progress note (the back-channel's record_progress)."""

    text: str


class Subtask(msgspec.Struct, kw_only=True, tag="subtask"):
    """A subtask of this task: spawned by its agent (`event` "spawned") or ended ("ended")."""

    event: Literal["spawned", "ended"]
    number: int
    text: str  # the subtask's title, or how it ended
    state: str = ""
    summary: str = ""


class ModelCall(msgspec.Struct, kw_only=True, tag="model_call"):
    """One call through the model gateway (tasks/run/gateway): what it cost and how it went."""

    provider: str  # "anthropic" | "openai"
    model: str
    status: int  # the HTTP status the agent got (502/504: the upstream was unreachable or too slow)
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    latency_ms: int = 0
    ttfb_ms: int | None = None
    cost_usd: float | None = None  # null when the model has no price
    stream: bool = False
    error: str = ""
    api: str = ""  # "messages" | "chat_completions" | "responses"


class EgressBlocked(msgspec.Struct, kw_only=True, tag="egress_blocked"):
    """A request the egress proxy refused (egress/; notified as `egress.blocked`)."""

    text: str  # one line for people
    host: str
    port: int
    method: str  # "CONNECT" for a tunnel
    rules: str  # the rule set that refused: "allow-list", "address", "request" or "limit"
    reason: str
    phase: str = "run"  # "environment": the environment's setup asked (docs/environments.md)


class PolicyBypass(msgspec.Struct, kw_only=True, tag="policy_bypass"):
    """A tool call the agent ran without forgehand's allow decision (tasks/run/runtimes/ledger.py;
    notified as `policy.bypassed`): the run fails `policy_bypass`."""

    text: str  # one line for people
    tool_use_id: str
    tool_name: str
    tool_input: Any = None
    reason: str


class ToolRunEvent(msgspec.Struct, kw_only=True, tag="tool_run"):
    """A custom tool's run changed state (docs/tools.md): asked (`awaiting_approval` or `queued`),
    `running`, or finished; a person's approval card reads the run itself, never this event."""

    text: str  # one line for people
    tool_run_id: int
    tool: str  # the tool's name (agents call it custom_<tool>)
    version: int
    state: str
    inputs_hash: str
    exit_code: int | None = None
    failure_reason: str | None = None
    output_tail: str = ""  # the last 4 KiB, redacted


Payload = (
    Prompt
    | Assistant
    | ToolCall
    | ToolResult
    | Output
    | Notice
    | System
    | Summary
    | Question
    | ModelCall
    | EgressBlocked
    | PolicyBypass
    | Progress
    | Subtask
    | ToolRunEvent
)
P = TypeVar("P", bound=msgspec.Struct)

_PAYLOAD_KIND: dict[type, tuple[str, ...]] = {
    Prompt: ("prompt",),
    Assistant: ("assistant",),
    ToolCall: ("tool_call",),
    ToolResult: ("tool_result",),
    Output: ("stdout", "stderr"),
    Notice: ("notice",),
    System: ("system",),
    Summary: ("summary",),
    Question: ("question",),
    ModelCall: ("model_call",),
    EgressBlocked: ("egress_blocked",),
    PolicyBypass: ("policy_bypass",),
    Progress: ("progress",),
    Subtask: ("subtask",),
    ToolRunEvent: ("tool_run",),
}


class EventRead(msgspec.Struct, kw_only=True):
    """One transcript event as the API and SSE show it (schema_version 1)."""

    seq: int
    kind: str
    at: datetime
    run: int | None  # the run's attempt number within the task
    schema_version: int
    payload: dict[str, Any]


class EventRaw(msgspec.Struct, kw_only=True):
    """`EventRead` with its payload as the stored JSON text: encodes to the same JSON without
    decoding and re-encoding the payload (the live transcript's hot path, `read_raw`)."""

    seq: int
    kind: str
    at: datetime
    run: int | None
    schema_version: int
    payload: msgspec.Raw


class Pending(msgspec.Struct, kw_only=True):
    kind: Kind
    payload: Payload
    run_id: int | None = None
    at: datetime = msgspec.field(default_factory=utcnow)
    # The payload's JSON as the writer's redaction encoded it (secrets replaced): stored as it is,
    # so a later change to an object the payload shares cannot alter what was recorded. b"": not
    # encoded yet (`append` encodes it).
    encoded: bytes = b""


# --- storing and reading -----------------------------------------------------------------------


# Characters JSON may hold raw but that some line readers end a line at (Python's `splitlines`:
# NEL, LINE and PARAGRAPH SEPARATOR): escaped, since the live transcript sends the stored text as
# an SSE data line (msgspec writes them raw, json.dumps escaped them).
_LINE_BREAKERS = ((b"\xc2\x85", b"\\u0085"), (b"\xe2\x80\xa8", b"\\u2028"), (b"\xe2\x80\xa9", b"\\u2029"))


def _line_safe(data: bytes) -> bytes:
    if not data.isascii():
        for raw, escaped in _LINE_BREAKERS:
            data = data.replace(raw, escaped)
    return data


def stored_json(payload: Payload, encoded: bytes = b"") -> msgspec.Raw:
    """The payload as the `payload` column holds it: its JSON object without the `type` tag (the
    row's kind says it). `encoded` is its JSON already made (tag first, as msgspec writes a tagged
    struct); the tag is cut off that text instead of encoding the fields again."""
    source = encoded or msgspec.json.encode(payload)
    data = _line_safe(source)
    prefix = b'{"type":"' + type(payload).__struct_config__.tag.encode() + b'"'  # type: ignore[union-attr]
    if data.startswith(prefix):
        rest = data[len(prefix) :]
        if rest[:1] == b",":
            return msgspec.Raw(b"{" + rest[1:])
        if rest == b"}":
            return msgspec.Raw(b"{}")
    # Another shape than msgspec writes today: the same text (redacted, if it was), without its tag.
    fields: dict[str, Any] = msgspec.json.decode(source)
    fields.pop("type", None)
    return msgspec.Raw(_line_safe(msgspec.json.encode(fields)))


_EVENTS: Table = TranscriptEvent.__table__  # type: ignore[assignment]  # a declarative model's table


async def append(session: AsyncSession, task_id: int, events: Sequence[Pending]) -> list[int]:
    """Insert events with the next sequence numbers of the task (in the caller's transaction)."""
    if not events:
        return []
    for ev in events:
        if ev.kind not in _PAYLOAD_KIND[type(ev.payload)]:
            raise ValueError(f"payload {type(ev.payload).__name__} is not a {ev.kind} event")
    stmt = (
        update(Task)
        .where(Task.id == task_id)
        .values(last_seq=Task.last_seq + len(events))
        .returning(Task.last_seq)
        .execution_options(synchronize_session=False)
    )
    last = int((await session.execute(stmt)).scalar_one())
    first = last - len(events) + 1
    # One multi-row INSERT, not a unit-of-work flush: an ORM flush inserts row by row (one
    # round trip to the driver's thread each), which a busy process turns into a wait per event.
    rows = [
        {
            "task_id": task_id,
            "seq": first + i,
            "run_id": ev.run_id,
            "at": ev.at,
            "kind": ev.kind,
            "schema_version": SCHEMA_VERSION,
            # The JSON text itself: the engine's serializer (forge.db.engine.json_text) passes it on.
            "payload": stored_json(ev.payload, ev.encoded),
        }
        for i, ev in enumerate(events)
    ]
    await session.execute(insert(_EVENTS), rows)
    return list(range(first, last + 1))


async def read(session: AsyncSession, task_id: int, *, after: int = 0, limit: int = 500) -> list[EventRead]:
    stmt = (
        select(TranscriptEvent, Run.seq)
        .outerjoin(Run, Run.id == TranscriptEvent.run_id)
        .where(TranscriptEvent.task_id == task_id, TranscriptEvent.seq > after)
        .order_by(TranscriptEvent.seq)
        .limit(limit)
    )
    rows = (await session.execute(stmt)).all()
    return [
        EventRead(
            seq=ev.seq,
            kind=ev.kind,
            at=ev.at,
            run=run_seq,
            schema_version=ev.schema_version,
            payload=dict(ev.payload or {}),
        )
        for ev, run_seq in rows
    ]


_EMPTY = msgspec.Raw(b"{}")


async def read_raw(session: AsyncSession, task_id: int, *, after: int = 0, limit: int = 500) -> list[EventRaw]:
    """`read`, with each payload as the JSON text the database holds (columns, not ORM objects)."""
    stmt = (
        select(
            TranscriptEvent.seq,
            TranscriptEvent.kind,
            TranscriptEvent.at,
            Run.seq,
            TranscriptEvent.schema_version,
            cast(TranscriptEvent.payload, Text),
        )
        .outerjoin(Run, Run.id == TranscriptEvent.run_id)
        .where(TranscriptEvent.task_id == task_id, TranscriptEvent.seq > after)
        .order_by(TranscriptEvent.seq)
        .limit(limit)
    )
    out = []
    for seq, kind, at, run_seq, version, text in (await session.execute(stmt)).all():
        # The stored text is the serializer's one-line JSON object; anything else (NULL, `null`)
        # is read as `read` reads it: an empty object.
        payload = msgspec.Raw(text.encode()) if text and text.lstrip().startswith("{") else _EMPTY
        out.append(EventRaw(seq=seq, kind=kind, at=at, run=run_seq, schema_version=version, payload=payload))
    return out
