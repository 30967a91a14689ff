"""Codex's `exec --json` lines (as 0.171.0 prints them) normalised into transcript events."""

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest

from tasks.core.capping import HeadTail
from tasks.core.transcript import Assistant, Notice, System, ToolCall, ToolResult
from tasks.run.runtimes.cli_lines import BATCH_LINES, StdoutReader
from tasks.run.runtimes.codex.runtime import CodexRuntime, provider_config
from tasks.run.runtimes.codex.stream import Allowed, StreamState
from tasks.run.runtimes.tool_kinds import tool_kind
from tests.support.waiting import event, until

# One run, measured: a patch, a failing command, a message, the turn's usage.
LINES: list[dict[str, Any]] = [
    {"type": "thread.started", "thread_id": "01a23232-e619-7a03-b72a-24b33a8f9e0f"},
    {"type": "item.completed", "item": {"id": "item_0", "type": "error", "message": "Model metadata not found"}},
    {"type": "turn.started"},
    {
        "type": "item.started",
        "item": {
            "id": "item_1",
            "type": "file_change",
            "changes": [{"path": "/w/a.txt", "kind": "add"}],
            "status": "in_progress",
        },
    },
    {
        "type": "item.completed",
        "item": {
            "id": "item_1",
            "type": "file_change",
            "changes": [{"path": "/w/a.txt", "kind": "add"}],
            "status": "completed",
        },
    },
    {
        "type": "item.started",
        "item": {
            "id": "item_2",
            "type": "command_execution",
            "command": "/bin/bash -lc false",
            "aggregated_output": "",
            "exit_code": None,
            "status": "in_progress",
        },
    },
    {
        "type": "item.completed",
        "item": {
            "id": "item_2",
            "type": "command_execution",
            "command": "/bin/bash -lc false",
            "aggregated_output": "oops\n",
            "exit_code": 1,
            "status": "failed",
        },
    },
    {"type": "item.completed", "item": {"id": "item_3", "type": "reasoning", "text": "thinking about it"}},
    {"type": "item.completed", "item": {"id": "item_4", "type": "agent_message", "text": "done"}},
    {
        "type": "turn.completed",
        "usage": {
            "input_tokens": 200,
            "cached_input_tokens": 40,
            "cache_write_input_tokens": 0,
            "output_tokens": 14,
            "reasoning_output_tokens": 4,
        },
    },
]


def test_a_run_s_lines_become_transcript_events() -> None:
    state = StreamState("0.171.0")
    events = [e for line in LINES for e in state.feed(line)]
    kinds = [k for k, _ in events]
    assert kinds == [
        "system",
        "notice",
        "tool_call",
        "tool_result",
        "tool_call",
        "tool_result",
        "system",
        "assistant",
        "system",
    ]
    started = events[0][1]
    assert isinstance(started, System) and started.text == "codex 0.171.0 started thread " + LINES[0]["thread_id"]
    assert isinstance(events[1][1], Notice) and events[1][1].level == "warning"
    patch, patched = events[2][1], events[3][1]
    assert isinstance(patch, ToolCall) and (patch.name, patch.kind) == ("apply_patch", "edit")
    assert isinstance(patched, ToolResult) and patched.output == "add /w/a.txt" and not patched.is_error
    shell, failed = events[4][1], events[5][1]
    assert isinstance(shell, ToolCall) and shell.input == {"command": "/bin/bash -lc false"}
    assert isinstance(failed, ToolResult) and failed.is_error and failed.output == "oops\n\n(exit code 1)"
    assert isinstance(events[7][1], Assistant) and events[7][1].text == "done"
    assert state.session_id == LINES[0]["thread_id"]
    assert state.final and state.completed == 1 and state.last_message == "done"
    assert (state.input_tokens, state.output_tokens) == (200, 14)
    assert state.usage["cached_input_tokens"] == 40


def test_a_completed_item_never_seen_started_still_has_its_call() -> None:
    state = StreamState()
    item = {"id": "item_9", "type": "command_execution", "command": "ls", "aggregated_output": "a\n", "exit_code": 0}
    events = state.feed({"type": "item.completed", "item": item})
    assert [k for k, _ in events] == ["tool_call", "tool_result"]


def test_a_failed_turn_and_an_error_line_are_final_failures() -> None:
    state = StreamState()
    assert not state.final
    [(kind, payload)] = state.feed({"type": "turn.failed", "error": {"message": "unexpected status 503"}})
    assert kind == "notice" and isinstance(payload, Notice) and payload.level == "error"
    assert state.final and state.failure == "unexpected status 503"
    other = StreamState()
    other.feed({"type": "error", "message": "stream disconnected before completion"})
    assert other.final and "disconnected" in other.failure


def test_unknown_lines_and_partial_messages_make_no_events() -> None:
    state = StreamState()
    assert state.feed({"type": "something.new"}) == []
    assert state.feed({"type": "item.started", "item": {"id": "i", "type": "agent_message", "text": ""}}) == []
    assert state.feed({"type": "item.completed", "item": "not an object"}) == []
    assert state.feed({"type": "item.completed", "item": {"id": "t", "type": "todo_list", "items": []}}) == []


def test_tool_kinds_by_the_names_the_hooks_use() -> None:
    assert tool_kind("Bash") == "execute"
    assert tool_kind("apply_patch") == "edit"
    assert tool_kind("mcp__forgehand__ask_user") == "other"


def test_the_provider_points_at_the_relay_with_the_run_token() -> None:
    assert provider_config("http://127.0.0.1:4100/v1") == (
        'model_providers.forgehand={name="forgehand", base_url="http://127.0.0.1:4100/v1", '
        'env_key="FORGEHAND_RUN_TOKEN", wire_api="responses"}'
    )
    [relay] = CodexRuntime().relays()
    assert (relay.port, relay.socket) == (4100, "gateway.sock")


def test_the_command_line_keeps_codex_to_forgehand_s_provider_and_back_channel() -> None:
    from tests.support.claude_host import StubChannel, host_context

    channel = StubChannel()
    channel.provider.openai_model = "gpt-5.5"
    ctx = host_context(None, None, None, channel=channel)  # type: ignore[arg-type]
    argv = CodexRuntime().argv(ctx, "", "-starts with a dash")
    assert argv[:5] == ["/usr/local/bin/codex", "exec", "--json", "--skip-git-repo-check",
                        "--dangerously-bypass-approvals-and-sandbox"]  # fmt: skip
    flags = [argv[i + 1] for i, a in enumerate(argv) if a == "-c"]
    assert 'model_provider="forgehand"' in flags and 'web_search="disabled"' in flags
    assert {"features.plugins=false", "analytics.enabled=false", "features.unified_exec_tty=false"} <= set(flags)
    assert (
        'mcp_servers.forgehand={url="http://127.0.0.1:4100/mcp", bearer_token_env_var="FORGEHAND_RUN_TOKEN"}' in flags
    )
    assert argv[-4:] == ["-m", "gpt-5.5", "--", "-starts with a dash"]
    assert CodexRuntime().argv(ctx, "thread-1", "go on")[-5:] == ["gpt-5.5", "resume", "thread-1", "--", "go on"]
    channel.provider.allow_web_search = True  # the repository allows it: Codex's own default applies
    assert 'web_search="disabled"' not in CodexRuntime().argv(ctx, "", "x")


def test_items_carry_the_id_name_and_input_the_policy_saw() -> None:
    state = StreamState()
    patch = "*** Begin Patch\n*** Add File: /w/a.txt\n+a\n*** End Patch\n"
    state.allowed(Allowed(id="call_p", name="apply_patch", input={"command": patch}))
    state.allowed(Allowed(id="call_b", name="Bash", input={"command": "echo hi"}))
    events = [e for line in LINES[3:7] for e in state.feed(line)]  # the file change, then `false`
    patch_call, patch_result, shell_call, shell_result = (p for _, p in events)
    assert isinstance(patch_call, ToolCall) and (patch_call.id, patch_call.name) == ("call_p", "apply_patch")
    assert patch_call.input == {"command": patch}
    assert isinstance(patch_result, ToolResult) and patch_result.id == "call_p"
    # `/bin/bash -lc false` holds no allowed command: the item keeps its own id and shape.
    assert isinstance(shell_call, ToolCall) and (shell_call.id, shell_call.name) == ("item_2", "exec_command")
    assert isinstance(shell_result, ToolResult) and shell_result.id == "item_2"
    item = {"id": "item_7", "type": "command_execution", "command": "/bin/bash -lc 'echo hi'", "status": "in_progress"}
    [(_, started)] = state.feed({"type": "item.started", "item": item})
    assert isinstance(started, ToolCall) and (started.id, started.input) == ("call_b", {"command": "echo hi"})


def test_lines_read_together_normalise_as_one_by_one() -> None:
    """`feed_lines` (the runtime's path for what its reader has queued) gives the same events as
    the lines fed one at a time; an undecodable line is kept raw and skipped."""
    raws = [msgspec.json.encode(line) for line in LINES]
    raws.insert(2, b"not json {")
    kept = HeadTail()
    together = StreamState("0.171.0").feed_lines(raws, kept)
    one_state = StreamState("0.171.0")
    one_by_one = [ev for line in LINES for ev in one_state.feed(line)]
    assert together == one_by_one
    assert b"not json {\n" in bytes(kept.head)


class _Piped:
    """A pipe read as `chunks`. When `paced`, each read after the first waits for the test's
    go-ahead (`more`): the next read of the pipe comes later. `ended` is set once every read was
    handed to the reader (which has then queued its end, or found no room for it)."""

    def __init__(self, chunks: list[list[bytes]], *, paced: bool = False) -> None:
        self.chunks = chunks
        self.paced = paced
        self.more = asyncio.Event()
        self.ended = asyncio.Event()

    async def stdout_batches(self) -> AsyncIterator[list[bytes]]:
        for i, chunk in enumerate(self.chunks):
            if i and self.paced:
                await self.more.wait()
                self.more.clear()
            yield chunk
        self.ended.set()


def test_the_reader_hands_over_every_queued_line_then_the_end() -> None:
    async def go() -> list[list[bytes] | None]:
        piped = _Piped([[b"a", b"b", b"c"], [b"d"]], paced=True)
        reader = StdoutReader(piped)
        got: list[list[bytes] | None] = []
        try:
            while True:
                lines = await reader.next_lines(5.0)
                got.append(lines)
                if lines is None:
                    return got
                piped.more.set()
        finally:
            await reader.close()

    assert asyncio.run(go()) == [[b"a", b"b", b"c"], [b"d"], None]


def test_the_reader_times_out_on_silence() -> None:
    async def go() -> None:
        reader = StdoutReader(_Piped([[b"a"], []], paced=True))  # the second read never comes
        try:
            assert await reader.next_lines(5.0) == [b"a"]
            with pytest.raises(TimeoutError):
                await reader.next_lines(0.01)
        finally:
            await reader.close()

    asyncio.run(go())


def test_the_reader_hands_a_batch_over_line_by_line_or_with_the_rest() -> None:
    """next_line takes one line of a batch read together; next_lines then takes the rest of it with
    every batch queued behind it; the end comes once, after the last line."""

    async def go() -> list[object]:
        piped = _Piped([[b"a", b"b", b"c"], [b"d"], [b"e"]])
        reader = StdoutReader(piped)
        try:
            first = await reader.next_line(5.0)
            await event(piped.ended, timeout=30, what="the later reads to be queued")
            rest = await reader.next_lines(5.0)
            return [first, rest, await reader.next_line(5.0), await reader.next_lines(5.0)]
        finally:
            await reader.close()

    assert asyncio.run(go()) == [b"a", [b"b", b"c", b"d", b"e"], None, None]


def test_lines_read_together_are_kept_for_the_raw_artefact_in_order() -> None:
    kept = HeadTail(64)
    StreamState().feed_lines([b'{"type": "turn.started"}', b"x" * 40, b"tail"], kept)
    assert (
        kept.text() == '{"type": "turn.started"}\n' + "x" * 7 + "\n[... 7 bytes omitted ...]\n" + "x" * 26 + "\ntail\n"
    )


def test_the_reader_hands_over_at_most_a_batch_of_lines_at_once() -> None:
    """A read of the pipe full of short lines is stored as several batches of at most BATCH_LINES
    (each a transaction), in order, nothing lost."""
    many = [str(i).encode() for i in range(BATCH_LINES * 2 + 10)]

    async def go() -> list[int]:
        reader = StdoutReader(_Piped([many]))
        sizes: list[int] = []
        got: list[bytes] = []
        try:
            while (lines := await reader.next_lines(5.0)) is not None:
                sizes.append(len(lines))
                got += lines
        finally:
            await reader.close()
        assert got == many
        return sizes

    assert asyncio.run(go()) == [BATCH_LINES, BATCH_LINES, 10]


class _Endless:
    """A CLI that keeps printing (a line a read), as an agent may after its turn was cut."""

    def __init__(self) -> None:
        self.reads = 0

    async def stdout_batches(self) -> AsyncIterator[list[bytes]]:
        while True:
            self.reads += 1
            yield [b"more"]
            await asyncio.sleep(0.001)  # the printer's own pace (part of the scenario, not a wait)


def test_close_returns_while_the_process_keeps_printing_into_a_full_queue() -> None:
    async def go() -> None:
        endless = _Endless()
        reader = StdoutReader(endless)
        taken = await reader.next_lines(5.0)
        assert taken
        # The queue fills up: nobody takes from it. A read is handed over only once the one
        # before was queued, so the fifth read past those taken is the one waiting for room
        # behind four queued reads.
        await until(lambda: endless.reads >= len(taken) + 5, timeout=30, what="the queue to be full")
        async with asyncio.timeout(2):  # before the fix: waited for room that never came
            await reader.close()

    asyncio.run(go())


def test_the_end_comes_after_every_line_when_it_found_the_queue_full() -> None:
    async def go() -> list[bytes]:
        piped = _Piped([[b"1"], [b"2"], [b"3"], [b"4"]])
        reader = StdoutReader(piped)
        # Every read is done: the end found the queue (4 reads) full.
        await event(piped.ended, timeout=30, what="every read of the pipe")
        got: list[bytes] = []
        try:
            while (lines := await reader.next_lines(1.0)) is not None:
                got += lines
            assert await reader.next_line(1.0) is None
        finally:
            await reader.close()
        return got

    assert asyncio.run(go()) == [b"1", b"2", b"3", b"4"]
