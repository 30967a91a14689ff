"""Signing: the HS256 JWT of every request and the Standard Webhooks headers of notifications."""

import base64
import hashlib
import hmac
import json
import secrets
import uuid
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from forge.version import VERSION
from webhooks.protocol import NOT_BEFORE_SKEW, SECRET_BYTES, encode_secret, kid_for, normalize_audience, sha256_hex

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
    return encode_hs256(key, claims), jti


@lru_cache(maxsize=1024)
def _header_segment(kid: str) -> bytes:
    header = {"alg": "HS256", "kid": kid, "typ": "JWT"}
    return _b64url(json.dumps(header, separators=(",", ":"), sort_keys=True).encode())


def _b64url(data: bytes) -> bytes:
    return base64.urlsafe_b64encode(data).rstrip(b"=")


def encode_hs256(key: SigningKey, claims: dict[str, Any]) -> str:
    """An HS256 JWT, byte for byte what `jwt.encode(claims, key, "HS256", headers={"kid", "typ"})`
    produces (sorted compact header, compact claims in insertion order), at a fraction of the cost:
    the header segment is computed once per key id."""
    signing_input = _header_segment(key.kid) + b"." + _b64url(json.dumps(claims, separators=(",", ":")).encode())
    signature = hmac.new(key.key, signing_input, hashlib.sha256).digest()
    return (signing_input + b"." + _b64url(signature)).decode("ascii")


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
