"""Consumer SDK: verify forgehand's webhook requests and route them to callbacks.

Needs only PyJWT and the standard library, so a third party can use it without the rest of
forgehand::

    from webhooks.consumer import Consumer, Verifier, allow, deny

    verifier = Verifier(audience="https://hooks.example.com/forgehand", secrets=["whsec_..."])

    def pre_tool_use(req):
        if req.data["tool_name"] == "bash":
            return deny("no shell here")
        return None  # no opinion

    consumer = Consumer(verifier, policy={"pre_tool_use": pre_tool_use}, notify=print)
    # WSGI: consumer.wsgi; ASGI: consumer.asgi; any framework: consumer.handle(method, headers, body)

Verification follows the contract's order, each step with its own typed error (a subclass of
`VerificationError` carrying the HTTP status to answer and a stable `code`): POST; a `Bearer`
token; HS256 only and `typ` JWT; the signature with the secret named by `kid`; every claim
present and well typed; the time window; the issuer (if configured); a body of at most 10 MiB
(413); then the body is bound to the token: its SHA-256, the audience (compared with the
**configured** audience, never with Host, the request URL or forwarded headers),
`schema_version`, `wid` = `meta.delivery_id`, `type`, and `sub` = the task (or repository) in
`meta`. No hostile input raises anything but a `VerificationError`.

Duplicates are recognised by `wid` (never `jti`, which changes per attempt): a notification seen
before is acknowledged without calling the callback again; a policy event seen before gets the
answer it got the first time. Responses are fully encoded before anything is written, so a
callback that returns something unencodable (or raises) yields a 500, never an empty 200.
"""

import asyncio
import base64
import binascii
import hmac
import inspect
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import jwt

from webhooks.protocol import (
    DECISIONS,
    MAX_REQUEST_BODY,
    POLICY_EVENTS,
    REQUIRED_CLAIMS,
    SCHEMA_VERSION,
    STRING_CLAIMS,
    TIME_CLAIMS,
    StrictJSONError,
    decode_secret,
    encode_json,
    kid_for,
    loads_strict,
    normalize_audience,
    sha256_hex,
    subject_for,
)

__all__ = [
    "BadSignature",
    "BindingMismatch",
    "BodyTooLarge",
    "Consumer",
    "Expired",
    "HookRequest",
    "HttpResponse",
    "InvalidClaim",
    "MalformedBody",
    "MalformedToken",
    "MethodNotAllowed",
    "MissingClaim",
    "MissingToken",
    "NotYetValid",
    "UnknownKey",
    "UnsupportedAlgorithm",
    "UnsupportedSchema",
    "VerificationError",
    "Verifier",
    "WrongAudience",
    "WrongIssuer",
    "allow",
    "ask",
    "deny",
]


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


def allow(input_override: Any = None, *, model_context: str = "", user_message: str = "") -> dict[str, Any]:
    permission: dict[str, Any] = {"decision": "allow"}
    if input_override is not None:
        permission["input_override"] = input_override
    return _answer(permission, model_context, user_message)


def deny(reason: str = "", *, model_context: str = "", user_message: str = "") -> dict[str, Any]:
    return _answer({"decision": "deny", "reason": reason}, model_context, user_message)


def ask(reason: str = "", *, model_context: str = "", user_message: str = "") -> dict[str, Any]:
    return _answer({"decision": "ask", "reason": reason}, model_context, user_message)


def _answer(permission: dict[str, Any] | None, model_context: str, user_message: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if permission is not None:
        out["permission"] = permission
    if model_context:
        out["model_context"] = model_context
    if user_message:
        out["user_message"] = user_message
    return out


@dataclass
class HttpResponse:
    status: int
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""


def _error_response(status: int, code: str, message: str) -> HttpResponse:
    body = encode_json({"error": code, "message": message[:200]})
    return HttpResponse(status, [("Content-Type", "application/json")], body)


Callback = Callable[[HookRequest], Any]


class Consumer:
    """Routes verified requests: `policy[event](request)` answers policy events (return None for
    no opinion, or `allow(...)`/`deny(...)`/`ask(...)`/a dict of the response shape);
    `notify(request)` receives notifications (its return value is ignored). `log(record)` gets one
    dict per request (verified or not). Duplicates (same `wid`) are answered from memory."""

    def __init__(
        self,
        verifier: Verifier,
        *,
        policy: Mapping[str, Callback] | None = None,
        notify: Callback | None = None,
        log: Callable[[dict[str, Any]], None] | None = None,
        remember: int = 10_000,
    ) -> None:
        self.verifier = verifier
        self.policy = dict(policy or {})
        self.notify = notify
        self.log = log
        self._remember = remember
        self._seen: OrderedDict[tuple[str, str], HttpResponse] = OrderedDict()
        self._lock = threading.Lock()

    # -- core ----------------------------------------------------------------------------------

    def _recall(self, key: tuple[str, str]) -> HttpResponse | None:
        with self._lock:
            hit = self._seen.get(key)
            if hit is not None:
                self._seen.move_to_end(key)
            return hit

    def _keep(self, key: tuple[str, str], response: HttpResponse) -> None:
        with self._lock:
            self._seen[key] = response
            while len(self._seen) > self._remember:
                self._seen.popitem(last=False)

    @staticmethod
    def _key(req: HookRequest) -> tuple[str, str]:
        # Policy answers depend on the exact body (a retry has the same body); notifications on wid.
        return (req.wid, str(req.claims["body_sha256"]) if req.is_policy else "")

    def _log(self, record: dict[str, Any]) -> None:
        if self.log is not None:
            try:
                self.log(record)
            except Exception:  # a logging failure never changes the answer
                return

    def _encode(self, req: HookRequest, result: Any) -> HttpResponse:
        if not req.is_policy:
            return HttpResponse(204)
        if result is None:
            return HttpResponse(200, [("Content-Type", "application/json")], b"")
        try:
            body = encode_json(result)
        except (TypeError, ValueError, UnicodeEncodeError, RecursionError):
            return _error_response(500, "encode_failed", "the answer could not be encoded")
        return HttpResponse(200, [("Content-Type", "application/json")], body)

    def _route(self, req: HookRequest) -> Callback | None:
        if req.is_policy:
            return self.policy.get(req.type)
        return self.notify

    def prepare(
        self, method: str, headers: Mapping[str, str] | Iterable[tuple[str, str]], body: bytes
    ) -> tuple[HookRequest | None, HttpResponse | None]:
        try:
            req = self.verifier.verify(method, headers, body)
        except VerificationError as exc:
            self._log({"event": "rejected", "code": exc.code, "status": exc.status, "message": exc.message})
            return None, _error_response(exc.status, exc.code, exc.message)
        cached = self._recall(self._key(req))
        if cached is not None:
            self._log({"event": req.type, "wid": req.wid, "duplicate": True})
            return req, cached
        return req, None

    def finish(self, req: HookRequest, result: Any) -> HttpResponse:
        response = self._encode(req, result)
        if 200 <= response.status < 300:
            self._keep(self._key(req), response)
        return response

    def handle(self, method: str, headers: Mapping[str, str] | Iterable[tuple[str, str]], body: bytes) -> HttpResponse:
        """Verify, route and answer one request (synchronous callbacks)."""
        req, early = self.prepare(method, headers, body)
        if early is not None or req is None:
            return early or _error_response(400, "bad_request", "bad request")
        callback = self._route(req)
        try:
            result = callback(req) if callback is not None else None
            if inspect.isawaitable(result):
                raise TypeError("async callback used with the synchronous handler")
        except Exception as exc:
            self._log({"event": req.type, "wid": req.wid, "error": type(exc).__name__})
            return _error_response(500, "callback_failed", "the consumer failed")
        return self.finish(req, result)

    async def handle_async(
        self, method: str, headers: Mapping[str, str] | Iterable[tuple[str, str]], body: bytes
    ) -> HttpResponse:
        """As `handle`, for async servers: coroutine callbacks are awaited, plain ones run in a thread."""
        req, early = self.prepare(method, headers, body)
        if early is not None or req is None:
            return early or _error_response(400, "bad_request", "bad request")
        callback = self._route(req)
        try:
            if callback is None:
                result = None
            elif inspect.iscoroutinefunction(callback):
                result = await callback(req)
            else:
                result = await asyncio.to_thread(callback, req)
                if inspect.isawaitable(result):
                    result = await result
        except Exception as exc:
            self._log({"event": req.type, "wid": req.wid, "error": type(exc).__name__})
            return _error_response(500, "callback_failed", "the consumer failed")
        return self.finish(req, result)

    # -- adapters ------------------------------------------------------------------------------

    def wsgi(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        """A WSGI application."""
        headers = [(k[5:].replace("_", "-"), v) for k, v in environ.items() if k.startswith("HTTP_")]
        if environ.get("CONTENT_TYPE"):
            headers.append(("content-type", environ["CONTENT_TYPE"]))
        response = self._wsgi_response(environ, headers)
        start_response(
            f"{response.status} {_REASONS.get(response.status, 'Status')}",
            [*response.headers, ("Content-Length", str(len(response.body)))],
        )
        return [response.body]

    def _wsgi_response(self, environ: dict[str, Any], headers: list[tuple[str, str]]) -> HttpResponse:
        method = str(environ.get("REQUEST_METHOD", ""))
        try:
            self.verifier.verify_headers(method, headers)
            length = int(environ.get("CONTENT_LENGTH") or "0")
            if length < 0:
                raise MalformedBody("bad Content-Length")
            self.verifier.check_length(length)
        except VerificationError as exc:
            return _error_response(exc.status, exc.code, exc.message)
        except ValueError:
            return _error_response(400, "malformed_body", "bad Content-Length")
        body = environ["wsgi.input"].read(length) if length else b""
        return self.handle(method, headers, body)

    async def asgi(self, scope: dict[str, Any], receive: Callable[[], Awaitable[Any]], send: Any) -> None:
        """An ASGI application (HTTP only)."""
        if scope.get("type") != "http":
            return
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope.get("headers", [])]
        response = await self._asgi_response(scope, receive, headers)
        await send(
            {
                "type": "http.response.start",
                "status": response.status,
                "headers": [
                    *((k.encode("latin-1"), v.encode("latin-1")) for k, v in response.headers),
                    (b"content-length", str(len(response.body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": response.body})

    async def _asgi_response(
        self, scope: dict[str, Any], receive: Callable[[], Awaitable[Any]], headers: list[tuple[str, str]]
    ) -> HttpResponse:
        method = str(scope.get("method", ""))
        try:
            self.verifier.verify_headers(method, headers)
            declared = {k.lower(): v for k, v in headers}.get("content-length")
            if declared is not None:
                self.verifier.check_length(int(declared))
        except VerificationError as exc:
            return _error_response(exc.status, exc.code, exc.message)
        except ValueError:
            return _error_response(400, "malformed_body", "bad Content-Length")
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message.get("type") == "http.disconnect":
                return _error_response(400, "malformed_body", "client went away")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.verifier.max_body:
                return _error_response(413, "body_too_large", "body too large")
            chunks.append(chunk)
            if not message.get("more_body"):
                break
        return await self.handle_async(method, headers, b"".join(chunks))


_REASONS = {
    200: "OK",
    204: "No Content",
    400: "Bad Request",
    401: "Unauthorized",
    405: "Method Not Allowed",
    411: "Length Required",
    413: "Content Too Large",
    500: "Internal Server Error",
}

# Decisions each policy event accepts, for consumers that want to validate their own answers.
ACCEPTED_DECISIONS = DECISIONS
