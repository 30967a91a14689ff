"""The pure parts of the custom tool pages: a `tool_run` transcript event is a tool-run line of its
own (an unknown kind or state never becomes anything a person decides), the tool form's refusals
land at their fields, the live schema check's answers, and the diff between two versions."""

from datetime import UTC, datetime
from typing import Any

from forge.core.errors import Conflict, InvalidInput
from tasks.core.custom_tool_schemas import ToolVersionRead
from tasks.core.transcript import EventRead
from tasks.http.pages import tool_forms
from tasks.http.pages.timeline import build
from tasks.http.pages.tool_forms import ToolForm

AT = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
RUN = {"text": "custom_lookup (version 2) failed: exit code 3", "tool_run_id": 7, "tool": "lookup", "version": 2}


def ev(seq: int, kind: str, **payload: Any) -> EventRead:
    return EventRead(seq=seq, kind=kind, at=AT, run=1, schema_version=1, payload=payload)


def test_a_tool_run_event_is_a_tool_run_line_and_an_unknown_kind_only_facts() -> None:
    tail = "\n".join(f"line {n}" for n in range(40))
    items = build(
        [
            ev(1, "tool_call", id="c1", name="custom_lookup", input={"pattern": "x"}),
            ev(2, "tool_run", **RUN, state="failed", exit_code=3, inputs_hash="h", output_tail=tail),
            ev(3, "tool_run", **RUN, state="approved_by_magic", inputs_hash="h"),
            ev(4, "tool_approval", text="approve me", state="awaiting_approval", tool_run_id=7),
        ]
    )
    assert [i.kind for i in items] == ["tool", "tool_run", "tool_run", "generic"]
    call, failed, odd, unknown = items
    assert call.pause is None and call.result is None  # the run's events never settle or park the call
    assert failed.label == "failed" and failed.name == "custom_lookup" and failed.tool_run_id == 7
    assert ("exit_code", "3") in failed.facts and ("version", "2") in failed.facts
    assert failed.tail is not None and failed.tail.long and failed.tail.text == tail
    assert odd.label == "unknown" and odd.tail is None  # a state it does not know is said as such
    assert unknown.label == "tool_approval" and unknown.pause is None and unknown.result is None


def test_a_refusal_lands_at_the_field_it_names() -> None:
    cases = [
        (InvalidInput("name: 'Bad' must be snake_case", code="invalid_tool_name"), "name"),
        (Conflict("a tool named x exists already here", code="conflict"), "name"),
        (InvalidInput("parameters.properties.o: type 'object'", code="invalid_tool_schema"), "parameters"),
        (InvalidInput("mode: `auto` ... read_only", code="invalid_tool_mode"), "mode"),
        (InvalidInput("script: a non-empty script of at most 64 KiB", code="invalid_tool_definition"), "script"),
        (InvalidInput("timeout_seconds: from 10 to 1800", code="invalid_tool_definition"), "timeout_seconds"),
    ]
    for exc, field in cases:
        assert tool_forms.errors_of(exc).first == field, exc.detail
    nul = tool_forms.errors_of(InvalidInput("script and description must not contain NUL characters"))
    assert not nul.fields and nul.general.startswith("script and description")


def test_the_form_is_the_rest_body_and_the_live_check_says_what_saving_would() -> None:
    form = ToolForm(name=" lookup ", parameters="", script="echo a\r\necho b\r\n", timeout_seconds="30")
    made = tool_forms.tool_create(form)
    assert made.name == "lookup" and made.script == "echo a\necho b\n" and made.timeout_seconds == 30
    assert made.parameters == {"type": "object", "properties": {}, "required": []}
    for bad in ("ten", "-1", "1e3"):
        try:
            tool_forms.tool_create(ToolForm(name="x", script="true", timeout_seconds=bad))
        except InvalidInput as exc:
            assert exc.extra["field"] == "timeout_seconds"
        else:
            raise AssertionError(bad)
    twice = '{"type": "object", "properties": {"a": {"type": "boolean"}, "a": {"type": "boolean"}}}'
    check = tool_forms.check_schema(twice)
    assert not check.ok and "duplicate key 'a'" in check.message
    assert tool_forms.check_schema("").ok
    assert tool_forms.check_schema('{"type": "object", "properties": {}}').message == "Valid: the tool takes no inputs."


def version(number: int, **kw: Any) -> ToolVersionRead:
    fields: dict[str, Any] = {
        "version": number, "active": False, "description": "", "script": "echo one\n", "interpreter": "sh",
        "mode": "approval", "read_only": False, "timeout_seconds": 60, "created_by": "ana",
        "proposed_by_task": None, "created_at": AT, "parameters": {"type": "object", "properties": {}},
    }  # fmt: skip
    return ToolVersionRead(**{**fields, **kw})


def test_the_diff_between_two_versions() -> None:
    one, two = version(1), version(2, script="echo two\n", mode="auto", read_only=True)
    diff = tool_forms.version_diff(one, two)
    assert [(d.origin, d.text) for d in diff.script if d.origin in "+-"] == [("-", "echo one"), ("+", "echo two")]
    assert diff.parameters == [] and not diff.same
    assert [(c.name, c.old, c.new) for c in diff.changes] == [("mode", "approval", "auto"), ("read only", "no", "yes")]
    # By default: the latest against the one before it; one version alone has nothing to compare.
    chosen = tool_forms.choose_diff([one, two, version(3)], None, None)
    assert chosen is not None and (chosen.old, chosen.new) == (2, 3)
    assert tool_forms.choose_diff([one], None, None) is None
    same = tool_forms.choose_diff([one, two], 1, 1)
    assert same is not None and same.same
