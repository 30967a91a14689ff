"""Signing: the HS256 JWT of every request (PyJWT, the library the consumer SDK verifies with, so
the project has one token implementation) and the Standard Webhooks headers of notifications (an
HMAC over `id.timestamp.body`, a different scheme from the JWT)."""

import base64
import hashlib
import hmac
import json
import secrets
import uuid
from dataclasses import dataclass

import jwt
from jwt.algorithms import HMACAlgorithm

from forge.core.version import VERSION
from webhooks.sdk.protocol import NOT_BEFORE_SKEW, SECRET_BYTES, encode_secret, kid_for, normalize_audience, sha256_hex

USER_AGENT = f"forgehand/{VERSION}"


@dataclass(frozen=True)
class SigningKey:
    kid: str
    key: bytes


def new_secret() -> tuple[SigningKey, str]:
    """A fresh secret: the key (to store, encrypted) and its `whsec_` form (to show once)."""
    key = secrets.token_bytes(SECRET_BYTES)
    return SigningKey(kid_for(key), key), encode_secret(key)


def sign_jwt(
    key: SigningKey,
    *,
    issuer: str,
    subject: str,
    audience: str,
    wid: str,
    event_type: str,
    body: bytes,
    budget: float,
    now: int,
    jti: str | None = None,
) -> tuple[str, str]:
    """The Bearer token binding this exact body to this endpoint, and its `jti`."""
    jti = jti or str(uuid.uuid4())
    claims = {
        "iss": issuer,
        "sub": subject,
        "aud": normalize_audience(audience),
        "iat": now,
        "nbf": now - NOT_BEFORE_SKEW,
        "exp": now + int(budget + 0.999) + NOT_BEFORE_SKEW,
        "jti": jti,
        "wid": wid,
        "type": event_type,
        "body_sha256": sha256_hex(body),
    }
    payload = json.dumps(claims, separators=(",", ":")).encode()  # as `jwt.encode` serialises claims
    return _JWS.encode(payload, key.key, "HS256", headers={"kid": key.kid}), jti


class _CheckedOnceHS256(HMACAlgorithm):
    """PyJWT's HS256, with its per-call key checks (is this secret a PEM, SSH or DER key, a JWK?)
    done once per key: they were most of the cost of a token, and our keys are random bytes
    that only change with a rotation. Signing itself is PyJWT's."""

    def __init__(self) -> None:
        super().__init__(HMACAlgorithm.SHA256)
        self._checked: set[bytes] = set()

    def prepare_key(self, key: str | bytes) -> bytes:
        if isinstance(key, bytes) and key in self._checked:
            return key
        prepared = super().prepare_key(key)
        if len(self._checked) >= 1024:
            self._checked.clear()
        self._checked.add(prepared)
        return prepared


# `sign_jwt` is `jwt.encode(claims, key, "HS256", headers={"kid": ...})` byte for byte (the claims
# serialised as PyJWT does, then PyJWT's JWS encoder), through one encoder built once whose HS256
# checks each key once.
_JWS = jwt.PyJWS(algorithms=[])
_JWS.register_algorithm("HS256", _CheckedOnceHS256())


def standard_signature(keys: list[SigningKey], wid: str, timestamp: int, body: bytes) -> str:
    """`webhook-signature`: one `v1,<base64 HMAC-SHA256("id.timestamp.body")>` per secret."""
    signed = f"{wid}.{timestamp}.".encode() + body
    sigs = [base64.b64encode(hmac.new(k.key, signed, hashlib.sha256).digest()).decode() for k in keys]
    return " ".join(f"v1,{s}" for s in sigs)


def request_headers(
    *,
    token: str,
    event_type: str,
    wid: str,
    notification_keys: list[SigningKey] | None,
    timestamp: int,
    body: bytes,
) -> list[tuple[str, str]]:
    headers = [
        ("Authorization", f"Bearer {token}"),
        ("Content-Type", "application/json"),
        ("User-Agent", USER_AGENT),
        ("Forgehand-Event", event_type),
        ("Forgehand-Delivery", wid),
    ]
    if notification_keys:
        headers += [
            ("webhook-id", wid),
            ("webhook-timestamp", str(timestamp)),
            ("webhook-signature", standard_signature(notification_keys, wid, timestamp, body)),
        ]
    return headers


def redacted(headers: list[tuple[str, str]]) -> list[list[str]]:
    """Headers as kept in the delivery log: signatures are cut (the log outlives the token's
    window, but a signature is still nothing to leave lying around)."""
    out: list[list[str]] = []
    for name, value in headers:
        lower = name.lower()
        if lower == "authorization" and value.startswith("Bearer "):
            head, _, _sig = value[7:].rpartition(".")
            value = f"Bearer {head}.<signature redacted>"
        elif lower == "webhook-signature":
            value = " ".join("v1,<redacted>" for _ in value.split())
        out.append([name, value])
    return out
