"""Consumer SDK, verification: check that a request comes from forgehand and is bound to this
endpoint. Needs only PyJWT and the standard library.

Verification follows the contract's order, each step with its own typed error (a subclass of
`VerificationError` carrying the HTTP status to answer and a stable `code`): POST; a `Bearer`
token; HS256 only and `typ` JWT; the signature with the secret named by `kid`; every claim
present and well typed; the time window; the issuer (if configured); a body of at most 10 MiB
(413); then the body is bound to the token: its SHA-256, the audience (compared with the
**configured** audience, never with Host, the request URL or forwarded headers),
`schema_version`, `wid` = `meta.delivery_id`, `type`, and `sub` = the task (or repository) in
`meta`. No hostile input raises anything but a `VerificationError`.
"""

import base64
import binascii
import hmac
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import jwt

from webhooks.sdk.protocol import (
    MAX_REQUEST_BODY,
    POLICY_EVENTS,
    REQUIRED_CLAIMS,
    SCHEMA_VERSION,
    STRING_CLAIMS,
    TIME_CLAIMS,
    StrictJSONError,
    decode_secret,
    kid_for,
    loads_strict,
    normalize_audience,
    sha256_hex,
    subject_for,
)


class VerificationError(Exception):
    """A request that must not be trusted. `status` is what to answer; `code` is stable."""

    status = 401
    code = "unverified"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class MethodNotAllowed(VerificationError):
    status, code = 405, "method_not_allowed"


class MissingToken(VerificationError):
    code = "missing_token"


class MalformedToken(VerificationError):
    code = "malformed_token"


class UnsupportedAlgorithm(VerificationError):
    code = "unsupported_algorithm"


class UnknownKey(VerificationError):
    code = "unknown_key"


class BadSignature(VerificationError):
    code = "bad_signature"


class MissingClaim(VerificationError):
    code = "missing_claim"


class InvalidClaim(VerificationError):
    code = "invalid_claim"


class Expired(VerificationError):
    code = "expired"


class NotYetValid(VerificationError):
    code = "not_yet_valid"


class WrongIssuer(VerificationError):
    code = "wrong_issuer"


class BodyTooLarge(VerificationError):
    status, code = 413, "body_too_large"


class BindingMismatch(VerificationError):
    """The body is not the one the token was issued for (hash, wid, type or sub)."""

    code = "binding_mismatch"


class WrongAudience(VerificationError):
    code = "wrong_audience"


class MalformedBody(VerificationError):
    status, code = 400, "malformed_body"


class UnsupportedSchema(VerificationError):
    status, code = 400, "unsupported_schema"


@dataclass(frozen=True)
class Claims:
    """A verified token, before its body is bound."""

    kid: str
    values: dict[str, Any]

    @property
    def wid(self) -> str:
        return str(self.values["wid"])

    @property
    def type(self) -> str:
        return str(self.values["type"])


@dataclass(frozen=True)
class HookRequest:
    """A verified request: the envelope and what the token said."""

    type: str
    wid: str
    jti: str
    kid: str
    meta: dict[str, Any]
    data: dict[str, Any]
    claims: dict[str, Any]
    body: bytes

    @property
    def is_policy(self) -> bool:
        return self.type in POLICY_EVENTS

    @property
    def task_id(self) -> str | None:
        task = self.meta.get("task")
        return task.get("id") if isinstance(task, dict) and isinstance(task.get("id"), str) else None


def _headers_of(headers: Mapping[str, str] | Iterable[tuple[str, str]]) -> dict[str, list[str]]:
    items = headers.items() if isinstance(headers, Mapping) else headers
    out: dict[str, list[str]] = {}
    for key, value in items:
        k = key.decode("latin-1") if isinstance(key, bytes) else str(key)
        v = value.decode("latin-1") if isinstance(value, bytes) else str(value)
        out.setdefault(k.lower(), []).append(v)
    return out


def _b64url_json(segment: str) -> Any:
    try:
        raw = base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4))
    except (binascii.Error, ValueError):
        raise MalformedToken("token segment is not base64url") from None
    try:
        return loads_strict(raw, max_nesting=8)
    except StrictJSONError as exc:
        raise MalformedToken(f"token segment is not strict JSON ({exc})") from None


class Verifier:
    """Verifies requests for one configured audience with one or two secrets (rotation).

    `secrets` are `whsec_...` strings (each at least 32 bytes, else ValueError); the key id of
    each is derived from the secret itself, so no `kid` needs configuring. `issuer`, when given,
    must equal the token's `iss` (forgehand's instance id). `leeway` widens the time window."""

    def __init__(
        self,
        *,
        audience: str,
        secrets: str | Iterable[str],
        issuer: str | None = None,
        leeway: float = 5.0,
        max_body: int = MAX_REQUEST_BODY,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not isinstance(audience, str) or not audience.startswith(("https://", "http://")):
            raise ValueError("audience must be the endpoint URL as configured in forgehand")
        self.audience = normalize_audience(audience)
        keys = [decode_secret(s) for s in ([secrets] if isinstance(secrets, str) else list(secrets))]
        if not keys:
            raise ValueError("at least one secret is needed")
        self._keys = {kid_for(k): k for k in keys}
        self.issuer = issuer
        self.leeway = leeway
        self.max_body = max_body
        self.clock = clock
        self._jws = jwt.PyJWS()

    @property
    def kids(self) -> list[str]:
        return list(self._keys)

    def verify_headers(self, method: str, headers: Mapping[str, str] | Iterable[tuple[str, str]]) -> Claims:
        """Steps that need no body: method, token, algorithm, signature, claims, time, issuer."""
        try:
            return self._verify_headers(method, headers)
        except VerificationError:
            raise
        except Exception as exc:  # hostile input must never escape as anything else
            raise MalformedToken(f"unreadable request ({type(exc).__name__})") from None

    def _verify_headers(self, method: str, headers: Mapping[str, str] | Iterable[tuple[str, str]]) -> Claims:
        if method != "POST":
            raise MethodNotAllowed("only POST")
        values = _headers_of(headers).get("authorization", [])
        if len(values) != 1:
            raise MissingToken("one Authorization: Bearer header is required")
        # Only SP and HTAB are optional whitespace in a field value (RFC 9110).
        scheme, _, token = values[0].strip(" \t").partition(" ")
        token = token.strip(" \t")
        if scheme.lower() != "bearer" or not token:
            raise MissingToken("Authorization must be a Bearer token")
        parts = token.split(".")
        if len(parts) != 3 or not all(parts):
            raise MalformedToken("a JWT has three segments")
        header = _b64url_json(parts[0])
        if not isinstance(header, dict):
            raise MalformedToken("JWT header is not an object")
        if header.get("alg") != "HS256":
            raise UnsupportedAlgorithm("only HS256 is accepted")
        if header.get("typ") != "JWT":
            raise UnsupportedAlgorithm("typ must be JWT")
        kid = header.get("kid")
        key = self._keys.get(kid) if isinstance(kid, str) else None
        if key is None:
            raise UnknownKey("no configured secret has this kid")
        try:
            self._jws.decode(token, key, algorithms=["HS256"])
        except jwt.InvalidSignatureError:
            raise BadSignature("signature does not verify") from None
        except jwt.PyJWTError as exc:
            raise MalformedToken(f"token rejected ({type(exc).__name__})") from None
        claims = _b64url_json(parts[1])
        if not isinstance(claims, dict):
            raise MalformedToken("JWT claims are not an object")
        for name in REQUIRED_CLAIMS:
            if name not in claims:
                raise MissingClaim(f"claim {name!r} is missing")
        for name in STRING_CLAIMS:
            if not isinstance(claims[name], str) or not claims[name]:
                raise InvalidClaim(f"claim {name!r} must be a non-empty string")
        for name in TIME_CLAIMS:
            if type(claims[name]) is not int:
                raise InvalidClaim(f"claim {name!r} must be an integer")
        if claims["nbf"] > claims["exp"]:
            raise InvalidClaim("nbf is after exp")
        now = self.clock()
        if now + self.leeway < claims["nbf"]:
            raise NotYetValid("token not valid yet")
        if now - self.leeway > claims["exp"]:
            raise Expired("token expired")
        if self.issuer is not None and claims["iss"] != self.issuer:
            raise WrongIssuer("unexpected issuer")
        return Claims(kid=str(kid), values=claims)

    def check_length(self, length: int) -> None:
        if length > self.max_body:
            raise BodyTooLarge(f"body over {self.max_body} bytes")

    def verify_body(self, claims: Claims, body: bytes) -> HookRequest:
        """Bind the body to a verified token (size, hash, audience, envelope)."""
        try:
            return self._verify_body(claims, body)
        except VerificationError:
            raise
        except Exception as exc:
            raise MalformedBody(f"unreadable body ({type(exc).__name__})") from None

    def _verify_body(self, claims: Claims, body: bytes) -> HookRequest:
        c = claims.values
        self.check_length(len(body))
        if not hmac.compare_digest(sha256_hex(body), str(c["body_sha256"]).lower()):
            raise BindingMismatch("body_sha256 does not match the body")
        if not hmac.compare_digest(normalize_audience(str(c["aud"])), self.audience):
            raise WrongAudience("token was issued for another audience")
        try:
            envelope = loads_strict(body)
        except StrictJSONError as exc:
            raise MalformedBody(f"body is not strict JSON ({exc})") from None
        if not isinstance(envelope, dict) or set(envelope) - {"type", "meta", "data"}:
            raise MalformedBody("body must be an object with type, meta and data")
        meta, data, etype = envelope.get("meta"), envelope.get("data"), envelope.get("type")
        if not isinstance(meta, dict) or not isinstance(data, dict) or not isinstance(etype, str):
            raise MalformedBody("body must be an object with type, meta and data")
        version = meta.get("schema_version")
        if type(version) is not int or version != SCHEMA_VERSION:
            raise UnsupportedSchema(f"schema_version {version!r} is not {SCHEMA_VERSION}")
        if meta.get("delivery_id") != c["wid"]:
            raise BindingMismatch("wid does not match meta.delivery_id")
        if etype != c["type"]:
            raise BindingMismatch("type does not match the token")
        if c["sub"] != subject_for(meta):
            raise BindingMismatch("sub does not match the task in meta")
        return HookRequest(
            type=etype,
            wid=str(c["wid"]),
            jti=str(c["jti"]),
            kid=claims.kid,
            meta=meta,
            data=data,
            claims=c,
            body=bytes(body),
        )

    def verify(self, method: str, headers: Mapping[str, str] | Iterable[tuple[str, str]], body: bytes) -> HookRequest:
        """All steps, in the contract's order."""
        return self.verify_body(self.verify_headers(method, headers), body)


# -- answers ------------------------------------------------------------------------------------
