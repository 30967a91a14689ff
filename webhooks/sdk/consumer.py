"""Consumer SDK, answering: route verified requests to callbacks (`Consumer`, with WSGI and ASGI
adapters) and build their answers (`allow`, `deny`, `ask`). The SDK's public names are exported by
`webhooks.sdk`.

Duplicates are recognised by `wid` (never `jti`, which changes per attempt): a notification seen
before is acknowledged without calling the callback again; a policy event seen before gets the
answer it got the first time. Responses are fully encoded before anything is written, so a
callback that returns something unencodable (or raises) yields a 500, never an empty 200.
"""

import asyncio
import inspect
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from webhooks.sdk.protocol import DECISIONS, encode_json
from webhooks.sdk.verifier import HookRequest, MalformedBody, VerificationError, Verifier

__all__ = ["Consumer", "HttpResponse", "allow", "ask", "deny"]


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
