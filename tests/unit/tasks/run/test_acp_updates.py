"""ACP `session/update` normalisation and the permission option a decision picks (pure)."""

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from tasks.run.runtimes.acp.session import acp_mcp_servers
from tasks.run.runtimes.acp.updates import KNOWN_OPTION_KINDS, PART, UpdateState, choose_option, tool_name_of


def chunk(text: str, kind: str = "agent_message_chunk") -> dict[str, Any]:
    return {"sessionUpdate": kind, "content": {"type": "text", "text": text}}


def test_message_chunks_become_one_assistant_event_when_something_else_happens() -> None:
    state = UpdateState()
    assert state.feed(chunk("hel")) == [] and state.feed(chunk("lo")) == []
    events = state.feed({"sessionUpdate": "tool_call", "toolCallId": "c1", "title": "ls", "kind": "execute"})
    assert [(k, p.text) for k, p in events] == [("assistant", "hello")]
    assert state.feed(chunk("think", "agent_thought_chunk")) == []
    [(kind, thought)] = state.flush()
    assert (kind, thought.phase, thought.text) == ("system", "thought", "think")


def test_an_endless_message_is_shown_in_parts_none_cut_and_nothing_gathers_without_end() -> None:
    """An agent streaming chunks and nothing else: the text gathered never passes a part (64 Ki
    characters, at most the 256 KiB cap in UTF-8), and the parts joined are the whole text."""
    state = UpdateState()
    piece = "é" * 1000 + "\n"  # two bytes a character: a part of them still fits the byte cap
    shown: list[str] = []
    for n in range(1, 301):
        for kind, payload in state.feed(chunk(piece)):
            assert kind == "assistant"
            shown.append(payload.text)
        assert n * len(piece) - sum(map(len, shown)) <= PART  # what is held back
    shown += [payload.text for _, payload in state.flush()]
    assert len(shown) > 1 and all(len(part) <= PART for part in shown)
    assert "".join(shown) == piece * 300  # nothing cut, nothing lost
    thoughts = UpdateState()
    parts = [p.text for _ in range(300) for _, p in thoughts.feed(chunk(piece, "agent_thought_chunk"))]
    parts += [p.text for _, p in thoughts.flush()]
    assert len(parts) > 1 and "".join(parts) == piece * 300


def test_a_tool_call_is_held_until_its_input_is_complete_then_shown_once_with_its_result() -> None:
    state = UpdateState()
    start = {"sessionUpdate": "tool_call", "toolCallId": "c1", "title": "Write", "kind": "edit", "rawInput": {}}
    assert state.feed(start) == []
    assert state.feed({"sessionUpdate": "tool_call_update", "toolCallId": "c1", "rawInput": {"path": "a"}}) == []
    shown = state.feed({"sessionUpdate": "tool_call_update", "toolCallId": "c1", "status": "in_progress"})
    [(kind, call)] = shown
    assert (kind, call.id, call.name, call.kind, call.input) == ("tool_call", "c1", "Write", "edit", {"path": "a"})
    done = {
        "sessionUpdate": "tool_call_update",
        "toolCallId": "c1",
        "status": "failed",
        "content": [{"type": "content", "content": {"type": "text", "text": "no space"}}],
    }
    [(kind, result)] = state.feed(done)
    assert (kind, result.id, result.output, result.is_error) == ("tool_result", "c1", "no space", True)
    assert state.feed(done) == []  # a repeated completion is not a second result


def test_the_adapter_s_own_tool_name_wins_over_the_title() -> None:
    call = {"title": "`ls -la`", "kind": "execute", "_meta": {"claudeCode": {"toolName": "Bash"}}}
    assert tool_name_of(call) == "Bash"
    assert tool_name_of({"title": "`ls`"}) == "`ls`"
    assert tool_name_of({}) == "tool"


def test_plan_usage_and_replayed_history() -> None:
    state = UpdateState()
    [(kind, plan)] = state.feed({"sessionUpdate": "plan", "entries": [{"content": "read", "status": "completed"}]})
    assert (kind, plan.phase, plan.text) == ("system", "plan", "[completed] read")
    assert state.feed({"sessionUpdate": "usage_update", "used": 15, "size": 1000}) == []
    assert state.usage == {"used": 15, "size": 1000}
    state.replaying = True
    assert state.feed(chunk("old")) == [] and state.flush() == []
    assert state.feed("not an object") == []


OPTIONS = [
    {"optionId": "always", "kind": "allow_always"},
    {"optionId": "once", "kind": "allow_once"},
    {"optionId": "no", "kind": "reject_once"},
    {"optionId": "never", "kind": "reject_always"},
]


def test_options_are_chosen_by_kind() -> None:
    assert choose_option(OPTIONS, True) == ({"outcome": "selected", "optionId": "once"}, True, "")
    assert choose_option(OPTIONS, False) == ({"outcome": "selected", "optionId": "no"}, False, "")
    only_always = [{"optionId": "always", "kind": "allow_always"}]
    outcome, allowed, note = choose_option(only_always, True)
    assert (outcome, allowed) == ({"outcome": "cancelled"}, False) and "no allow_once" in note
    assert choose_option([{"optionId": "n", "kind": "reject_always"}], False)[0] == {"outcome": "cancelled"}
    assert choose_option(None, True)[:2] == ({"outcome": "cancelled"}, False)
    # One id for two kinds: the agent could read it as allow_always, so it is never chosen.
    shared = [{"optionId": "x", "kind": "allow_once"}, {"optionId": "x", "kind": "allow_always"}]
    assert choose_option(shared, True)[:2] == ({"outcome": "cancelled"}, False)


@given(
    st.lists(
        st.fixed_dictionaries(
            {"optionId": st.text(max_size=5), "kind": st.sampled_from([*KNOWN_OPTION_KINDS, "weird", ""])}
        ),
        max_size=6,
    ),
    st.booleans(),
)
def test_never_allow_always_and_only_allow_once_permits(options: list[dict[str, str]], allow: bool) -> None:
    outcome, allowed, _ = choose_option(options, allow)
    if outcome["outcome"] == "selected":
        kinds = {o["kind"] for o in options if o["optionId"] == outcome["optionId"]}
        assert "allow_always" not in kinds and "reject_always" not in kinds
        assert allowed == (allow and "allow_once" in kinds)
    else:
        assert outcome == {"outcome": "cancelled"} and not allowed
    if not allow:
        assert not allowed


def test_the_back_channel_config_becomes_an_acp_http_mcp_server() -> None:
    config = {"name": "forgehand", "url": "http://127.0.0.1:4100/mcp", "headers": {"Authorization": "Bearer t"}}
    assert acp_mcp_servers(config) == [
        {
            "type": "http",
            "name": "forgehand",
            "url": "http://127.0.0.1:4100/mcp",
            "headers": [{"name": "Authorization", "value": "Bearer t"}],
        }
    ]
    assert acp_mcp_servers(None) == [] and acp_mcp_servers({"name": "x"}) == []
