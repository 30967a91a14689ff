"""Strict decoding of policy responses: nothing malformed is ever read as "allow".

A response is an empty body or one JSON object
`{"permission": {"decision", "reason", "input_override"}, "model_context", "user_message"}`.
Everything else is a `ProtocolViolation` and the whole response is discarded: a body over 1 MiB,
`null`, a non-object, unknown fields (including case variants such as `Permission`), duplicate
keys at any depth, trailing data, nesting deeper than 128, NaN/Infinity, wrong types, a
`permission` on an event that takes none (or a decision it does not take), `allow` on
`user_prompt_submit` without a `{"prompt": string}` override, an override on anything but an
`allow` (or on an event without overrides), a non-object override on `pre_tool_use`, and a
`model_context` over 16 KiB of UTF-8.
"""

from typing import Any, Literal

import msgspec

from webhooks.sdk.protocol import (
    DECISIONS,
    MAX_MODEL_CONTEXT,
    MAX_POLICY_RESPONSE,
    OVERRIDABLE,
    StrictJSONError,
    loads_strict,
)

Decision = Literal["allow", "deny", "ask"]


class ProtocolViolation(Exception):
    """The response breaks the contract; `str(exc)` says how (safe to log, holds no body)."""


class _Permission(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    decision: Decision
    reason: str = ""
    input_override: Any = msgspec.UNSET


class _Response(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    permission: _Permission | msgspec.UnsetType = msgspec.UNSET
    model_context: str = ""
    user_message: str = ""


class PolicyAnswer(msgspec.Struct, frozen=True, kw_only=True):
    """A valid answer. `decision` None means no opinion; `input_override` is UNSET when absent."""

    decision: Decision | None = None
    reason: str = ""
    input_override: Any = msgspec.UNSET
    model_context: str = ""
    user_message: str = ""

    @property
    def has_override(self) -> bool:
        return self.input_override is not msgspec.UNSET


def decode_policy_response(event_type: str, body: bytes, *, truncated: bool = False) -> PolicyAnswer:
    if truncated or len(body) > MAX_POLICY_RESPONSE:
        raise ProtocolViolation(f"response body over {MAX_POLICY_RESPONSE} bytes")
    if not body:
        return PolicyAnswer()
    try:
        value = loads_strict(body)
    except StrictJSONError as exc:
        raise ProtocolViolation(str(exc)) from None
    if not isinstance(value, dict):
        raise ProtocolViolation(f"response is {'null' if value is None else type(value).__name__}, not an object")
    try:
        parsed = msgspec.convert(value, _Response, strict=True)
    except msgspec.ValidationError as exc:
        raise ProtocolViolation(f"response does not match the schema: {exc}") from None
    if len(parsed.model_context.encode("utf-8")) > MAX_MODEL_CONTEXT:
        raise ProtocolViolation(f"model_context over {MAX_MODEL_CONTEXT} bytes")
    permission = parsed.permission
    if isinstance(permission, msgspec.UnsetType):
        return PolicyAnswer(model_context=parsed.model_context, user_message=parsed.user_message)
    accepted = DECISIONS.get(event_type)
    if accepted is None:
        raise ProtocolViolation(f"{event_type} takes no permission")
    if permission.decision not in accepted:
        raise ProtocolViolation(f"{event_type} does not take {permission.decision!r}")
    override = permission.input_override
    has_override = override is not msgspec.UNSET
    if has_override and permission.decision != "allow":
        raise ProtocolViolation(f"{permission.decision} must not carry an input_override")
    if has_override and event_type not in OVERRIDABLE:
        raise ProtocolViolation(f"{event_type} takes no input_override")
    if (
        event_type == "user_prompt_submit"
        and permission.decision == "allow"
        and not (isinstance(override, dict) and set(override) == {"prompt"} and isinstance(override["prompt"], str))
    ):
        raise ProtocolViolation('allow on user_prompt_submit needs input_override {"prompt": string}')
    if event_type == "pre_tool_use" and has_override and not isinstance(override, dict):
        raise ProtocolViolation("input_override on pre_tool_use must be an object")
    return PolicyAnswer(
        decision=permission.decision,
        reason=permission.reason,
        input_override=override,
        model_context=parsed.model_context,
        user_message=parsed.user_message,
    )
