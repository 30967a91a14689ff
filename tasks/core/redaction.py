"""Secrets kept out of transcripts: known values (the run's keys and tokens) replaced by
`[REDACTED]` in every string an event holds, and in output streams even when a secret is split
across two chunks."""

from collections.abc import Iterable
from typing import Any

import msgspec

REDACTED = "[REDACTED]"


class Redactor:
    """Replaces known secrets. `feed` works on a stream: a secret split across two chunks is still
    found, because the longest tail that could start a secret is held back until the next chunk."""

    def __init__(self, secrets: Iterable[str]) -> None:
        # Short values would redact half the transcript and protect nothing.
        self.secrets = sorted({s for s in secrets if s and len(s) >= 8}, key=len, reverse=True)
        self._carry: dict[str, str] = {}
        # Secrets as they appear in JSON text, when each appears there as itself (no character
        # JSON escapes); otherwise None and every value is searched string by string.
        literal = all(msgspec.json.encode(s) == b'"' + s.encode() + b'"' for s in self.secrets)
        self._needles = [s.encode() for s in self.secrets] if literal else None

    @property
    def holding(self) -> bool:
        """Some stream's tail is held back (it could start a secret)."""
        return bool(self._carry)

    def clean(self, encoded: bytes) -> bool:
        """True only when the JSON text `encoded` holds no secret: then none of its strings does."""
        return self._needles is not None and all(needle not in encoded for needle in self._needles)

    def redact(self, text: str) -> str:
        for secret in self.secrets:
            if secret in text:
                text = text.replace(secret, REDACTED)
        return text

    def _held_back(self, text: str) -> int:
        """Length of the longest suffix of `text` that is a proper prefix of a secret."""
        best = 0
        for secret in self.secrets:
            for n in range(min(len(secret) - 1, len(text)), best, -1):
                if text.endswith(secret[:n]):
                    best = n
                    break
        return best

    def feed(self, stream: str, text: str) -> str:
        if not self.secrets:
            return text
        text = self.redact(self._carry.pop(stream, "") + text)
        hold = self._held_back(text)
        if hold:
            self._carry[stream] = text[-hold:]
            text = text[:-hold]
        return text

    def flush(self, stream: str) -> str:
        return self.redact(self._carry.pop(stream, ""))


def redacted_json(redactor: Redactor, payload: msgspec.Struct) -> bytes:
    """`payload`'s JSON with the secrets in its strings replaced (keys and numbers are kept). Most
    payloads hold no secret: one look at their JSON text says so, and that text is the answer,
    instead of a walk over every value."""
    encoded = msgspec.json.encode(payload)
    if redactor.clean(encoded):
        return encoded
    return msgspec.json.encode(redact_value(redactor, msgspec.to_builtins(payload)))


def redact_value(redactor: Redactor, value: Any) -> Any:
    if isinstance(value, str):
        return redactor.redact(value)
    if isinstance(value, list):
        return [redact_value(redactor, v) for v in value]
    if isinstance(value, dict):
        return {k: redact_value(redactor, v) for k, v in value.items()}
    return value
