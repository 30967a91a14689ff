"""Pure parts of tasks: the state graph, redaction (streamed), output caps, slugs, numbers."""

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from forge.core.errors import InvalidState, NotFound
from tasks.core.capping import HeadTail, cap_text
from tasks.core.redaction import REDACTED, Redactor, redacted_json
from tasks.core.states import TRANSITIONS, TaskState, check_transition
from tasks.core.transcript import Assistant, stored_json
from tasks.services.tasks import parse_number, slugify

SECRET = "sk-live-0123456789abcdef"


def test_state_helpers() -> None:
    assert {s for s in TaskState if s.is_terminal} == {TaskState.MERGED, TaskState.CLOSED}
    assert {s for s in TaskState if s.is_active} == {TaskState.QUEUED, TaskState.RUNNING}
    assert all(not TRANSITIONS[s] for s in TaskState if s.is_terminal)


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("queued", TaskState.RUNNING),
        ("running", TaskState.BLOCKED),
        ("failed", TaskState.QUEUED),
        ("awaiting_review", TaskState.CLOSED),
        ("stopped", TaskState.CLOSED),
        ("blocked", TaskState.QUEUED),
    ],
)
def test_allowed_transitions(old: str, new: TaskState) -> None:
    check_transition(old, new)


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("closed", TaskState.QUEUED),
        ("merged", TaskState.RUNNING),
        ("queued", TaskState.AWAITING_REVIEW),
        ("awaiting_review", TaskState.FAILED),
        ("running", TaskState.CLOSED),
    ],
)
def test_refused_transitions(old: str, new: TaskState) -> None:
    with pytest.raises(InvalidState):
        check_transition(old, new)


def test_redaction_in_one_piece_and_split() -> None:
    r = Redactor([SECRET, "short"])
    assert r.redact(f"a {SECRET} b short") == f"a {REDACTED} b short"  # short values are not secrets
    out = r.feed("stdout", "key=" + SECRET[:7]) + r.feed("stdout", SECRET[7:] + " end") + r.flush("stdout")
    assert out == f"key={REDACTED} end"


@given(st.text(max_size=40), st.text(max_size=40), st.lists(st.integers(min_value=0, max_value=80), max_size=6))
def test_streamed_redaction_never_leaks(prefix: str, suffix: str, cuts: list[int]) -> None:
    text = prefix + SECRET + suffix
    points = sorted({min(c, len(text)) for c in cuts})
    pieces = [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]
    r = Redactor([SECRET])
    out = "".join(r.feed("s", p) for p in pieces) + r.flush("s")
    assert SECRET not in out and out == r.redact(text)


def test_head_tail_cap() -> None:
    buf = HeadTail(cap=10)
    for _ in range(10):
        buf.add(b"0123456789")
    assert buf.omitted == 90
    assert buf.text().startswith("01234") and buf.text().endswith("56789")
    text, omitted = cap_text("x" * 100_000)
    assert omitted == 100_000 - 64 * 1024 and len(text) < 64 * 1024 + 100


@pytest.mark.parametrize("raw", ["0", "-1", "01", "1.5", "abc", "１", "9999999999", ""])
def test_task_numbers_must_be_positive_integers(raw: str) -> None:
    with pytest.raises(NotFound):
        parse_number(raw)


def test_slug() -> None:
    assert slugify("Fix the README: typos!") == "fix-the-readme-typos"
    assert slugify("!!!") == "task"


def test_a_stored_payload_is_the_redacted_text_whatever_its_field_order() -> None:
    """stored_json keeps what redaction made of the payload even when the text is not in the shape
    it cuts the tag from (tag first): it never falls back to the unredacted payload."""
    secret = "sk-core-secret-0123456789"
    payload = Assistant(text=f"the key is {secret}\u2028next")
    redacted = redacted_json(Redactor([secret]), payload)
    assert secret.encode() not in redacted
    fields = {k: v for k, v in msgspec.json.decode(redacted).items() if k != "type"}
    reordered = msgspec.json.encode({**fields, "type": "assistant"})
    assert not reordered.startswith(b'{"type"')
    for encoded in (redacted, reordered):
        stored = bytes(stored_json(payload, encoded))
        assert secret.encode() not in stored and b"\xe2\x80\xa8" not in stored  # LS escaped too
        assert msgspec.json.decode(stored) == fields and fields["text"] == f"the key is {REDACTED}\u2028next"
