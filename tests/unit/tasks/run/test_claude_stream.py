"""Claude Code's stream-json lines (shapes recorded from the CLI 2.1.332) into transcript events."""

from tasks.run.runtimes.claude.stream import StreamState, usage_of
from tasks.run.runtimes.tool_kinds import tool_kind

INIT = {"type": "system", "subtype": "init", "cwd": "/workspace", "session_id": "s-1", "model": "m",
        "permissionMode": "default", "claude_code_version": "2.1.332", "tools": ["Bash"]}  # fmt: skip
CALL = {"type": "assistant", "parent_tool_use_id": None, "session_id": "s-1",
        "message": {"content": [{"type": "tool_use", "id": "toolu_A", "name": "Bash",
                                 "input": {"command": "ls", "description": "list"}}]}}  # fmt: skip
TEXT = [{"type": "text", "text": "a\nb"}]
BLOCK = {"type": "tool_result", "tool_use_id": "toolu_A", "content": TEXT, "is_error": False}
RESULT = {"type": "user", "parent_tool_use_id": None, "session_id": "s-1",
          "message": {"role": "user", "content": [BLOCK]}}  # fmt: skip
SUB = {"type": "assistant", "parent_tool_use_id": "toolu_T", "agent_id": "x", "session_id": "s-1",
       "message": {"content": [{"type": "text", "text": "sub says"}]}}  # fmt: skip
FINAL = {"type": "result", "subtype": "success", "is_error": False, "result": "done", "num_turns": 2,
         "session_id": "s-1", "permission_denials": [{"tool_name": "Bash"}],
         "usage": {"input_tokens": 30, "cache_read_input_tokens": 5, "cache_creation_input_tokens": 2,
                   "output_tokens": 9}}  # fmt: skip


def test_lines_become_transcript_events() -> None:
    state = StreamState()
    ((kind, init),) = state.feed(INIT)
    assert kind == "system" and init.phase == "agent" and state.version == "2.1.332" and state.session_id == "s-1"
    ((kind, call),) = state.feed(CALL)
    assert kind == "tool_call" and (call.id, call.name, call.kind) == ("toolu_A", "Bash", "execute")
    assert call.input == {"command": "ls", "description": "list"}
    ((kind, result),) = state.feed(RESULT)
    assert kind == "tool_result" and (result.name, result.output, result.is_error) == ("Bash", "a\nb", False)
    ((kind, sub),) = state.feed(SUB)
    assert kind == "assistant" and sub.text == "sub says" and sub.parent_id == "toolu_T"
    ((kind, final),) = state.feed(FINAL)
    assert kind == "system" and final.phase == "agent_result" and final.detail["permission_denials"] == 1
    assert state.final is FINAL
    assert usage_of(FINAL) == (37, 9)


def test_the_last_result_is_final_and_subagents_are_tracked() -> None:
    state = StreamState()
    state.feed({"type": "system", "subtype": "task_started", "task_id": "t1", "tool_use_id": "toolu_T"})
    assert state.background == {"t1"}
    state.feed({**FINAL, "result": "first"})
    state.feed({"type": "system", "subtype": "task_notification", "task_id": "t1", "status": "completed"})
    assert state.background == set()
    state.feed({**FINAL, "result": "second"})
    assert state.final is not None and state.final["result"] == "second"


def test_control_and_unknown_lines_make_no_events() -> None:
    state = StreamState()
    assert state.feed({"type": "control_request", "request_id": "r", "request": {"subtype": "can_use_tool"}}) == []
    assert state.feed({"type": "stream_event"}) == []
    assert state.feed({"type": "user", "message": {"content": "plain"}}) == []


def test_tool_kinds() -> None:
    assert [tool_kind(n) for n in ("Read", "Edit", "Grep", "WebFetch", "Task", "mcp__x__y", "Odd")] == [
        "read", "edit", "search", "fetch", "think", "other", "other"]  # fmt: skip


def test_an_error_result_never_reads_as_success() -> None:
    """A model call that failed for good ends with subtype `success` and `is_error`: the run's
    phase and the task's error say "error", never "(success)"."""
    from tasks.run.runtimes.claude.stream import error_text

    failed = {**FINAL, "is_error": True, "result": "API Error: 403 forbidden", "terminal_reason": "api_error"}
    ((_, phase),) = StreamState().feed(failed)
    assert phase.text == "claude-code ended with an error" and "success" not in phase.text
    assert error_text(failed) == "claude ended with an error: API Error: 403 forbidden"
    turns = {**FINAL, "subtype": "error_max_turns", "is_error": True, "result": ""}
    ((_, limit),) = StreamState().feed(turns)
    assert limit.text == "claude-code ended with an error (error_max_turns)"
    assert error_text(turns) == "claude ended with an error (it reached its turn limit)"
    assert error_text({"subtype": "error_new_kind", "result": "x"}) == "claude ended with an error (error new kind): x"
    ((_, ok),) = StreamState().feed(FINAL)
    assert ok.text == "claude-code result: success"
