"""The wire contract shared by forgehand and consumers: names, limits and strict JSON.

Standard library only: the consumer SDK (`webhooks.sdk.consumer`) imports this module, and a third
party must be able to use the SDK without the rest of forgehand installed.
"""

import base64
import binascii
import hashlib
import json
import re
from typing import Any, Final, Literal, get_args
from urllib.parse import urlsplit, urlunsplit

SCHEMA_VERSION: Final = 1

POLICY_EVENTS: Final = (
    "session_start",
    "user_prompt_submit",
    "pre_tool_use",
    "post_tool_use",
    "stop",
    "pre_merge",
)
# The notification events, as one Literal that forgehand's payloads are tagged with (forge's
# `EventType`) and as the tuple a consumer checks names against.
EventType = Literal[
    "task.created",
    "task.state_changed",
    "run.started",
    "run.finished",
    "approval.requested",
    "approval.resolved",
    "review.submitted",
    "task.merged",
    "task.progress",
    "repo.pushed",
    "status.created",
    "pull_request.opened",
    "pull_request.synchronized",
    "pull_request.review_submitted",
    "pull_request.review_requested",
    "pull_request.merged",
    "pull_request.closed",
    "pull_request.reopened",
    "issue.opened",
    "issue.edited",
    "issue.closed",
    "issue.reopened",
    "issue.labeled",
    "issue.assigned",
    "comment.created",
    "comment.edited",
    "comment.deleted",
    "schedule.triggered",
    "egress.blocked",
    "policy.bypassed",
    "tool_run.queued",
    "tool_run.started",
    "tool_run.finished",
    "ping",
]
NOTIFY_EVENTS: Final[tuple[str, ...]] = get_args(EventType)
# Which decisions each policy event accepts in `permission` (absent: no permission at all).
DECISIONS: Final[dict[str, frozenset[str]]] = {
    "session_start": frozenset({"allow", "deny"}),
    "user_prompt_submit": frozenset({"allow", "deny"}),
    "pre_tool_use": frozenset({"allow", "deny", "ask"}),
    "pre_merge": frozenset({"allow", "deny"}),
}
# Events whose `allow` may carry an `input_override`.
OVERRIDABLE: Final = frozenset({"user_prompt_submit", "pre_tool_use"})

SECRET_PREFIX: Final = "whsec_"
SECRET_BYTES: Final = 32
MIN_SECRET_BYTES: Final = 32

MAX_REQUEST_BODY: Final = 10 * 1024 * 1024  # a consumer refuses more (413)
MAX_POLICY_RESPONSE: Final = 1024 * 1024  # forgehand refuses more (protocol error)
MAX_MODEL_CONTEXT: Final = 16 * 1024  # bytes of UTF-8
MAX_NESTING: Final = 128

DEFAULT_BUDGET: Final = 5.0  # seconds per policy dispatch
MAX_BUDGET: Final = 10.0
NOT_BEFORE_SKEW: Final = 30  # nbf = iat - 30; exp = iat + budget + 30

REQUIRED_CLAIMS: Final = ("iss", "sub", "aud", "iat", "nbf", "exp", "jti", "wid", "type", "body_sha256")
STRING_CLAIMS: Final = ("iss", "sub", "aud", "jti", "wid", "type", "body_sha256")
TIME_CLAIMS: Final = ("iat", "nbf", "exp")


def encode_secret(key: bytes) -> str:
    """The form a secret is shown in (once): `whsec_<base64>`, as Standard Webhooks expects."""
    return SECRET_PREFIX + base64.b64encode(key).decode("ascii")


def decode_secret(secret: str) -> bytes:
    """The key bytes of a `whsec_...` secret; refuses short or malformed secrets."""
    if not isinstance(secret, str) or not secret.startswith(SECRET_PREFIX):
        raise ValueError("a webhook secret starts with 'whsec_'")
    body = secret[len(SECRET_PREFIX) :].strip()
    try:
        key = base64.b64decode(body + "=" * (-len(body) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("a webhook secret is 'whsec_' followed by base64") from None
    if len(key) < MIN_SECRET_BYTES:
        raise ValueError(f"a webhook secret must hold at least {MIN_SECRET_BYTES} bytes, this one holds {len(key)}")
    return key


def kid_for(key: bytes) -> str:
    """The key id (JWT `kid`) of a secret: derived from it, so a consumer needs no extra setting."""
    return "k" + hashlib.sha256(b"forgehand-webhook-kid\x00" + key).hexdigest()[:16]


def normalize_audience(url: str) -> str:
    """The audience as compared: the URL as configured, except that a bare `/` path is dropped
    (`https://h/` and `https://h` are one audience). Nothing else is normalised."""
    parts = urlsplit(url)
    if parts.path == "/" and not parts.query:
        return urlunsplit((parts.scheme, parts.netloc, "", "", parts.fragment))
    return url


def subject_for(meta: Any, instance: str = "") -> str:
    """The JWT `sub` an envelope's `meta` implies."""
    task = meta.get("task") if isinstance(meta, dict) else None
    if isinstance(task, dict) and isinstance(task.get("id"), str):
        return f"forgehand:task:{task['id']}"
    repo_uuid = meta.get("repository_uuid") if isinstance(meta, dict) else None
    if isinstance(repo_uuid, str) and repo_uuid:
        return f"forgehand:repo:{repo_uuid}"
    inst = meta.get("instance") if isinstance(meta, dict) else None
    return f"forgehand:instance:{inst if isinstance(inst, str) else instance}"


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def encode_json(value: Any) -> bytes:
    """Compact UTF-8 JSON; refuses NaN/Infinity and unencodable values (ValueError/TypeError)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")


class StrictJSONError(ValueError):
    """The bytes are not one strict JSON value (see `loads_strict`)."""


_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def max_depth(data: bytes) -> int:
    """Deepest nesting of arrays/objects in JSON text (strings are skipped)."""
    brackets = _STRING.sub(b"", data).translate(None, _NOT_BRACKETS)
    depth = deepest = 0
    for ch in brackets:
        if ch in b"[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise StrictJSONError(f"duplicate key {key!r}")
        obj[key] = value
    return obj


def _no_constant(name: str) -> Any:
    raise StrictJSONError(f"{name} is not JSON")


def loads_strict(data: bytes, *, max_nesting: int = MAX_NESTING) -> Any:
    """Parse exactly one JSON value, refusing what lenient parsers let through: invalid UTF-8 (or a
    BOM), duplicate keys at any depth, NaN/Infinity, trailing data, nesting deeper than
    `max_nesting`, and strings that are not valid Unicode (lone surrogates)."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise StrictJSONError("expected bytes")
    raw = bytes(data)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise StrictJSONError("not UTF-8") from None
    if text.startswith("\ufeff"):
        raise StrictJSONError("byte order mark")
    if max_depth(raw) > max_nesting:
        raise StrictJSONError(f"nested deeper than {max_nesting}")
    try:
        value = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except StrictJSONError:
        raise
    except (ValueError, RecursionError) as exc:
        raise StrictJSONError(f"invalid JSON: {str(exc)[:120]}") from None
    try:
        # Lone surrogates (`"\\ud800"`) parse but cannot be stored or forwarded.
        encode_json(value)
    except (ValueError, UnicodeEncodeError):
        raise StrictJSONError("a string is not valid Unicode") from None
    return value
