"""Strict decoding of policy responses: every malformed answer is a protocol error, never an allow."""

import contextlib
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from webhooks.policy.answers import ProtocolViolation, decode_policy_response
from webhooks.sdk.protocol import MAX_MODEL_CONTEXT, MAX_POLICY_RESPONSE, StrictJSONError, loads_strict, max_depth


def test_empty_body_and_empty_object_are_no_opinion() -> None:
    for body in (b"", b"{}"):
        answer = decode_policy_response("pre_tool_use", body)
        assert answer.decision is None and not answer.has_override


def test_valid_answers_decode() -> None:
    a = decode_policy_response(
        "pre_tool_use",
        b'{"permission":{"decision":"allow","input_override":{"cmd":"ls"}},"model_context":"c","user_message":"m"}',
    )
    assert (a.decision, a.input_override, a.model_context, a.user_message) == ("allow", {"cmd": "ls"}, "c", "m")
    d = decode_policy_response("pre_tool_use", b'{"permission":{"decision":"deny","reason":"no"}}')
    assert (d.decision, d.reason) == ("deny", "no")
    assert decode_policy_response("pre_tool_use", b'{"permission":{"decision":"ask"}}').decision == "ask"
    p = decode_policy_response(
        "user_prompt_submit", b'{"permission":{"decision":"allow","input_override":{"prompt":"x"}}}'
    )
    assert p.input_override == {"prompt": "x"}
    assert decode_policy_response("pre_merge", b' {"permission":{"decision":"deny"}} \n').decision == "deny"
    assert decode_policy_response("stop", b'{"model_context":"go on"}').model_context == "go on"


DEEP = b'{"permission":{"decision":"allow","input_override":' + b'{"a":' * 130 + b"1" + b"}" * 130 + b"}}"

PROTOCOL_ERRORS = {
    "null": ("pre_tool_use", b"null"),
    "array": ("pre_tool_use", b"[]"),
    "string": ("pre_tool_use", b'"allow"'),
    "number": ("pre_tool_use", b"1"),
    "whitespace only": ("pre_tool_use", b"   "),
    "permission twice": ("pre_tool_use", b'{"permission":{"decision":"deny"},"permission":{"decision":"allow"}}'),
    "Permission vs permission": (
        "pre_tool_use",
        b'{"Permission":{"decision":"deny"},"permission":{"decision":"allow"}}',
    ),
    "case variant alone": ("pre_tool_use", b'{"Permission":{"decision":"allow"}}'),
    "duplicate nested": ("pre_tool_use", b'{"permission":{"decision":"allow","decision":"deny"}}'),
    "duplicate deep in override": (
        "pre_tool_use",
        b'{"permission":{"decision":"allow","input_override":{"a":{"b":1,"b":2}}}}',
    ),
    "unknown top-level field": ("pre_tool_use", b'{"permission":{"decision":"allow"},"extra":1}'),
    "unknown permission field": ("pre_tool_use", b'{"permission":{"decision":"allow","why":"x"}}'),
    "trailing data": ("pre_tool_use", b'{"permission":{"decision":"allow"}} {}'),
    "trailing garbage": ("pre_tool_use", b'{"permission":{"decision":"allow"}}x'),
    "over-deep nesting": ("pre_tool_use", DEEP),
    "NaN": ("pre_tool_use", b'{"permission":{"decision":"allow","input_override":{"n":NaN}}}'),
    "Infinity": ("pre_tool_use", b'{"permission":{"decision":"allow","input_override":{"n":-Infinity}}}'),
    "null permission": ("pre_tool_use", b'{"permission":null}'),
    "null context": ("pre_tool_use", b'{"model_context":null}'),
    "wrong type decision": ("pre_tool_use", b'{"permission":{"decision":1}}'),
    "unknown decision": ("pre_tool_use", b'{"permission":{"decision":"maybe"}}'),
    "uppercase decision": ("pre_tool_use", b'{"permission":{"decision":"ALLOW"}}'),
    "missing decision": ("pre_tool_use", b'{"permission":{}}'),
    "wrong type reason": ("pre_tool_use", b'{"permission":{"decision":"deny","reason":["x"]}}'),
    "permission on post_tool_use": ("post_tool_use", b'{"permission":{"decision":"allow"}}'),
    "permission on stop": ("stop", b'{"permission":{"decision":"deny"}}'),
    "ask on pre_merge": ("pre_merge", b'{"permission":{"decision":"ask"}}'),
    "ask on user_prompt_submit": ("user_prompt_submit", b'{"permission":{"decision":"ask"}}'),
    "allow on prompt without override": ("user_prompt_submit", b'{"permission":{"decision":"allow"}}'),
    "allow on prompt with non-string": (
        "user_prompt_submit",
        b'{"permission":{"decision":"allow","input_override":{"prompt":1}}}',
    ),
    "allow on prompt with extra key": (
        "user_prompt_submit",
        b'{"permission":{"decision":"allow","input_override":{"prompt":"x","more":1}}}',
    ),
    "deny with override": ("pre_tool_use", b'{"permission":{"decision":"deny","input_override":{}}}'),
    "deny with null override": ("pre_tool_use", b'{"permission":{"decision":"deny","input_override":null}}'),
    "ask with override": ("pre_tool_use", b'{"permission":{"decision":"ask","input_override":{}}}'),
    "override on session_start": ("session_start", b'{"permission":{"decision":"allow","input_override":{}}}'),
    "non-object tool override": ("pre_tool_use", b'{"permission":{"decision":"allow","input_override":[1]}}'),
    "oversize context": ("pre_tool_use", json.dumps({"model_context": "x" * (MAX_MODEL_CONTEXT + 1)}).encode()),
    "oversize context in multibyte": ("stop", json.dumps({"model_context": "é" * 8193}, ensure_ascii=False).encode()),
    "invalid utf-8": ("pre_tool_use", b'{"user_message":"\xff"}'),
    "byte order mark": ("pre_tool_use", b"\xef\xbb\xbf{}"),
    "lone surrogate": ("pre_tool_use", b'{"user_message":"\\ud800"}'),
    "single quotes": ("pre_tool_use", b"{'permission':{}}"),
    "comment": ("pre_tool_use", b'{"model_context":"x"/*c*/}'),
}


@pytest.mark.parametrize("case", sorted(PROTOCOL_ERRORS))
def test_protocol_errors(case: str) -> None:
    event, body = PROTOCOL_ERRORS[case]
    with pytest.raises(ProtocolViolation):
        decode_policy_response(event, body)


def test_body_over_one_mebibyte_is_refused_even_if_valid() -> None:
    body = json.dumps({"user_message": "x" * MAX_POLICY_RESPONSE}).encode()
    with pytest.raises(ProtocolViolation, match="over"):
        decode_policy_response("pre_tool_use", body)
    with pytest.raises(ProtocolViolation):
        decode_policy_response("pre_tool_use", b"{}", truncated=True)


def test_context_exactly_at_the_limit_is_accepted() -> None:
    body = json.dumps({"model_context": "x" * MAX_MODEL_CONTEXT}).encode()
    assert len(decode_policy_response("stop", body).model_context) == MAX_MODEL_CONTEXT


def test_nesting_limit_is_exact() -> None:
    ok = b"[" * 128 + b"]" * 128
    assert max_depth(ok) == 128
    assert loads_strict(ok) is not None
    with pytest.raises(StrictJSONError):
        loads_strict(b"[" * 129 + b"]" * 129)
    # brackets inside strings do not count
    assert max_depth(b'{"a":"[[[[\\"{{{{"}') == 1


@settings(max_examples=60)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(), lambda c: st.lists(c) | st.dictionaries(st.text(), c)
    )
)
def test_strict_loads_round_trips_plain_json(value: object) -> None:
    data = json.dumps(value).encode()
    if max_depth(data) <= 128:
        assert loads_strict(data) == value


@given(st.binary(max_size=200))
def test_arbitrary_bytes_never_escape_as_another_exception(data: bytes) -> None:
    for event in ("pre_tool_use", "user_prompt_submit", "stop"):
        with contextlib.suppress(ProtocolViolation):
            decode_policy_response(event, data)
