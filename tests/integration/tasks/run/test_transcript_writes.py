"""What the transcript writer stores is what was emitted, secrets replaced: one event at a time or
a batch of a CLI's lines (`emit_many`), whatever the runtime does with its objects afterwards, with
every JSON column written by msgspec (`forge.db.engine.json_text`)."""

import asyncio
import json
from typing import Any

import msgspec
import pytest
from sqlalchemy import select, text

from forge.core.settings import Settings
from forge.db.engine import Database, json_text
from tasks.core import transcript
from tasks.core.live import LiveHub
from tasks.core.models import TranscriptEvent
from tasks.core.redaction import REDACTED, Redactor
from tasks.core.transcript import Assistant, Kind, Notice, Output, Payload, ToolCall, ToolResult
from tasks.core.writer import BEHIND, TranscriptWriter
from tests.support.tasks import seed, start_task
from tests.support.waiting import event, loop_turns, until

SECRET = "sk-writer-secret-0123456789"


async def _stored(db: Database, task_id: int, after: int) -> list[tuple[str, dict[str, object]]]:
    async with db.session() as s:
        rows = await s.execute(
            select(TranscriptEvent.kind, TranscriptEvent.payload)
            .where(TranscriptEvent.task_id == task_id, TranscriptEvent.seq > after)
            .order_by(TranscriptEvent.seq)
        )
        return [(kind, payload) for kind, payload in rows.all()]


async def _stored_count(db: Database, task_id: int, after: int, n: int) -> bool:
    return len(await _stored(db, task_id, after)) >= n


async def _last(db: Database, task_id: int) -> int:
    async with db.session() as s:
        events = await transcript.read(s, task_id, limit=10_000)
        return events[-1].seq if events else 0


@pytest.fixture
async def task_id(settings: Settings, db: Database) -> int:
    await seed(settings)
    task_id, _, _ = await start_task(settings, db)
    return task_id


async def test_a_batch_is_stored_in_order_with_its_secrets_replaced(db: Database, task_id: int) -> None:
    after = await _last(db, task_id)
    writer = TranscriptWriter(db, LiveHub(), task_id, None, Redactor([SECRET]))
    writer.start()
    await writer.emit_many([
        ("assistant", Assistant(text="first")),
        ("tool_call", ToolCall(id="c1", name="exec_command", input={"command": f"echo {SECRET}"}, kind="execute")),
        ("tool_result", ToolResult(id="c1", name="exec_command", output=f"{SECRET}\n")),
        ("assistant", Assistant(text="last")),
    ])  # fmt: skip
    await writer.close()
    stored = await _stored(db, task_id, after)
    assert [k for k, _ in stored] == ["assistant", "tool_call", "tool_result", "assistant"]
    assert stored[0][1] == {"text": "first", "parent_id": ""}
    assert stored[1][1]["input"] == {"command": f"echo {REDACTED}"}
    assert stored[2][1]["output"] == f"{REDACTED}\n"
    assert SECRET not in json.dumps(stored)


async def test_a_batch_with_output_redacts_across_chunks_and_ends_the_streams(db: Database, task_id: int) -> None:
    """A secret split across two output chunks of a batch is still replaced, and output held
    back (it could start a secret) goes before the event that ends the stream."""
    after = await _last(db, task_id)
    writer = TranscriptWriter(db, LiveHub(), task_id, None, Redactor([SECRET]))
    writer.start()
    await writer.emit_many([
        ("stdout", Output(text="tail sk-writer-")),
        ("stdout", Output(text="secret-0123456789 ok")),
        ("stdout", Output(text=" sk-wri")),
        ("notice", Notice(text="after")),
    ])  # fmt: skip
    await writer.close()
    stored = await _stored(db, task_id, after)
    assert "".join(str(p["text"]) for k, p in stored if k == "stdout") == f"tail {REDACTED} ok sk-wri"
    assert stored[-1] == ("notice", {"text": "after", "level": "info"})
    assert SECRET not in json.dumps(stored)


async def test_an_object_changed_after_emit_does_not_change_what_was_recorded(db: Database, task_id: int) -> None:
    after = await _last(db, task_id)
    writer = TranscriptWriter(db, LiveHub(), task_id, None, Redactor([SECRET]), flush_interval=60)
    writer.start()
    shared = {"command": "ls"}
    await writer.emit("tool_call", ToolCall(id="c1", name="Bash", input=shared))
    await writer.emit_many([("tool_call", ToolCall(id="c2", name="Bash", input=shared))])
    shared["command"] = f"rm -rf / {SECRET}"  # the runtime reuses its dict before the flush
    await writer.close()
    stored = await _stored(db, task_id, after)
    assert [p["input"] for _, p in stored] == [{"command": "ls"}, {"command": "ls"}]


async def test_line_breaking_characters_are_escaped_in_the_stored_text(db: Database, task_id: int) -> None:
    """The live transcript sends the stored text as one SSE data line: characters a reader could
    end a line at are stored escaped (still the same JSON string)."""
    after = await _last(db, task_id)
    writer = TranscriptWriter(db, LiveHub(), task_id, None, Redactor([]))
    writer.start()
    said = "a\u2028b\u2029c\x85d é ✓"
    await writer.emit("assistant", Assistant(text=said))
    await writer.emit_many([("assistant", Assistant(text=said))])
    await writer.close()
    async with db.session() as s:
        raw = await transcript.read_raw(s, task_id, after=after)
        texts = list((await s.execute(text(
            "SELECT CAST(payload AS TEXT) FROM transcript_events WHERE task_id = :t AND seq > :a ORDER BY seq"
        ), {"t": task_id, "a": after})).scalars())  # fmt: skip
    assert [msgspec.json.decode(bytes(ev.payload))["text"] for ev in raw] == [said, said]
    for stored in texts:
        assert "\u2028" not in stored and "\u2029" not in stored and "\x85" not in stored
        assert "\\u2028" in stored


async def test_a_full_batch_is_stored_at_once_and_a_writer_far_behind_holds_the_stream(
    db: Database, task_id: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch that fills the buffer is stored now by the writer's loop (not after its pause, an
    hour here) while the caller goes on; once BEHIND buffers' worth wait for a store that does not
    end, emit_many waits for it, and everything is then stored once, in order."""
    after = await _last(db, task_id)
    writer = TranscriptWriter(db, LiveHub(), task_id, None, Redactor([]), flush_interval=3600, max_buffer=4)
    writer.start()

    def batch(start: int) -> list[tuple[Kind, Payload]]:
        return [("assistant", Assistant(text=f"line {n}")) for n in range(start, start + 4)]

    await writer.emit_many(batch(0))
    # The loop's own flush, long before its hour-long pause.
    await until(lambda: _stored_count(db, task_id, after, 4), timeout=30, what="the first batch to be stored")

    gate, entered = asyncio.Event(), asyncio.Event()
    append = transcript.append

    async def held(*args: Any, **kwargs: Any) -> None:
        entered.set()
        await gate.wait()  # a store that does not end (a slow database)
        await append(*args, **kwargs)

    monkeypatch.setattr(transcript, "append", held)
    async with asyncio.timeout(30):  # each call returns (the old writer waited in the store)
        await writer.emit_many(batch(4))  # the loop takes it and waits in its store
        await event(entered, timeout=30, what="the loop's store to begin")
        for start in range(8, 8 + 4 * (BEHIND - 1), 4):  # piles up behind it
            await writer.emit_many(batch(start))
    waiting = asyncio.ensure_future(writer.emit_many(batch(8 + 4 * (BEHIND - 1))))
    await loop_turns()  # the store is held: nothing else the call could wait for
    assert not waiting.done()  # BEHIND buffers' worth: the stream waits for the store
    gate.set()
    await waiting
    await writer.close()
    stored = await _stored(db, task_id, after)
    assert [p["text"] for _, p in stored] == [f"line {n}" for n in range(4 * (BEHIND + 2))]


async def test_big_events_make_the_stream_wait_for_the_store_before_the_buffer_fills(
    db: Database, task_id: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bound is in bytes too: an agent printing big events cannot make the worker hold a
    buffer's worth of them (512 here) while the store is slow."""
    after = await _last(db, task_id)
    writer = TranscriptWriter(db, LiveHub(), task_id, None, Redactor([]), flush_interval=3600, behind_bytes=1000)
    writer.start()
    gate = asyncio.Event()
    append = transcript.append

    async def held(*args: Any, **kwargs: Any) -> None:
        await gate.wait()
        await append(*args, **kwargs)

    monkeypatch.setattr(transcript, "append", held)
    async with asyncio.timeout(30):
        await writer.emit_many([("assistant", Assistant(text="a" * 600))])  # under the bound: returns
    waiting = asyncio.ensure_future(writer.emit_many([("assistant", Assistant(text="b" * 600))]))
    await loop_turns()  # the store is held: nothing else the call could wait for
    assert not waiting.done()  # 1,200 bytes buffered: it waits for the store
    gate.set()
    await waiting
    assert [p["text"] for _, p in await _stored(db, task_id, after)] == ["a" * 600, "b" * 600]  # stored by then
    await writer.close()


async def test_a_cancelled_caller_does_not_cut_its_store_short(
    db: Database, task_id: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store runs to its end though its caller is cancelled (a run's reader cancelled at the
    end of the run while it waited for the store): a cancel landing between a transaction's
    commit and its return put the events back, and close() stored them a second time."""
    after = await _last(db, task_id)
    writer = TranscriptWriter(db, LiveHub(), task_id, None, Redactor([]), flush_interval=3600, max_buffer=2)
    writer.start()
    gate, entered = asyncio.Event(), asyncio.Event()
    append = transcript.append

    async def held(*args: Any, **kwargs: Any) -> None:
        entered.set()
        await gate.wait()
        await append(*args, **kwargs)

    monkeypatch.setattr(transcript, "append", held)
    caller = asyncio.ensure_future(writer.emit("assistant", Assistant(text="one")))
    await caller  # under the bound: buffered
    caller = asyncio.ensure_future(writer.emit("assistant", Assistant(text="two")))  # full: stores
    async with asyncio.timeout(30):
        await entered.wait()
    caller.cancel()
    await loop_turns()  # the cancel lands; the store is held: nothing else the caller could wait for
    assert not caller.done()  # it waits for the store it began
    gate.set()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert [p["text"] for _, p in await _stored(db, task_id, after)] == ["one", "two"]  # stored, once
    await writer.close()
    assert [p["text"] for _, p in await _stored(db, task_id, after)] == ["one", "two"]


def test_json_columns_text() -> None:
    assert json_text({"a": [1, "é"], "b": None}) == '{"a":[1,"é"],"b":null}'
    assert json_text(msgspec.Raw(b'{"kept":"as it is"}')) == '{"kept":"as it is"}'
    # msgspec refuses a lone surrogate; json.dumps writes it escaped, as before
    assert json.loads(json_text({"s": "\ud800"})) == {"s": "\ud800"}
    with pytest.raises(TypeError):
        json_text({"x": object()})  # neither encoder knows it: an error, never a silent loss


async def test_stream_output_is_stored_within_the_cap_as_stored_not_as_written(db: Database, task_id: int) -> None:
    """Binary output decoded with replacement stores about twice its size (U+FFFD is three bytes,
    a control byte six): the cap counts what is stored; what is past it is counted and told once."""
    after = await _last(db, task_id)
    cap = 64 * 1024
    writer = TranscriptWriter(db, LiveHub(), task_id, None, Redactor([SECRET]), stream_cap=cap)
    writer.start()
    binary = bytes(range(256)) * 64  # 16 KiB a chunk, every byte value
    for _ in range(16):
        await writer.emit("stdout", Output(text=binary.decode("utf-8", "replace")))
    await writer.emit("stderr", Output(text="\x01" * 4096))
    await writer.emit("notice", Notice(text="after"))
    await writer.close()
    stored = await _stored(db, task_id, after)
    texts = [p for k, p in stored if k in ("stdout", "stderr")]
    size = sum(len(msgspec.json.encode(p["text"])) - 2 for p in texts)
    assert cap - 6 < size <= cap  # filled to the cap, never over it
    told = [p["omitted_bytes"] for p in texts if p.get("omitted_bytes")]
    written = 16 * len(binary.decode("utf-8", "replace").encode()) + 4096
    assert sum(told) == written - sum(len(str(p["text"]).encode()) for p in texts)
    assert ("notice", {"text": "after", "level": "info"}) in stored
