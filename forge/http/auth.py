"""One authentication middleware: Bearer token, HTTP Basic with a token as password, or the session
cookie. It resolves a `Principal` into `request.user` (anonymous when nothing is presented) and
refuses bad credentials with 401 and an audit row. Authorization is `forge.core.access`'s job."""

import base64
import secrets
from typing import Any

from litestar.connection import ASGIConnection
from litestar.middleware import AbstractAuthenticationMiddleware, AuthenticationResult
from litestar.middleware._internal.exceptions import ExceptionHandlerMiddleware
from litestar.types import ASGIApp, Receive, Scope, Send

from forge.accounts import tokens, websessions
from forge.core.access import ANONYMOUS, Principal
from forge.core.error_codes import Code
from forge.core.errors import Unauthenticated
from forge.db import audit
from forge.db.audit import Actor
from forge.db.engine import Database


class AuthState:
    """What the middleware needs, kept on `app.state.auth`."""

    def __init__(self, db: Database, token_cache: tokens.TokenCache) -> None:
        self.db = db
        self.token_cache = token_cache


def client_addr(connection: ASGIConnection) -> str:  # type: ignore[type-arg]
    return connection.client.host if connection.client else ""


def request_id(connection: ASGIConnection) -> str:  # type: ignore[type-arg]
    state = connection.scope.setdefault("state", {})
    rid = state.get("request_id")
    if rid is None:
        rid = state["request_id"] = secrets.token_hex(8)
    return str(rid)


def actor_of(connection: ASGIConnection) -> Actor:  # type: ignore[type-arg]
    user = connection.scope.get("user")
    principal = user if isinstance(user, Principal) else ANONYMOUS
    return Actor(principal=principal, client_addr=client_addr(connection), request_id=request_id(connection))


def signed_in(connection: ASGIConnection, _: object) -> None:  # type: ignore[type-arg]
    """The guard of everything that exists only for an account, API and pages alike (`/api/v1/user`,
    `/api/v1/admin`, `/settings`, a person's task lists): an anonymous caller gets 401 before its
    body is even decoded, so clients prompt for a token instead of reporting a validation error,
    and a browser's GET is sent to the sign-in page (`forge.http.problems`)."""
    if connection.scope.get("method") == "OPTIONS":
        return  # what a path allows is no secret (and preflights carry no credentials)
    if not actor_of(connection).principal.is_authenticated:
        raise Unauthenticated("sign in or send a token")


def _basic_password(value: str) -> str:
    try:
        decoded = base64.b64decode(value.strip(), validate=True).decode("utf-8")
    except ValueError:  # binascii.Error, UnicodeDecodeError, and non-ASCII input
        raise Unauthenticated("malformed Basic credentials", code=Code.INVALID_CREDENTIALS) from None
    _user, sep, password = decoded.partition(":")
    if not sep:
        raise Unauthenticated("malformed Basic credentials", code=Code.INVALID_CREDENTIALS)
    return password


class AuthMiddleware(AbstractAuthenticationMiddleware):
    async def authenticate_request(self, connection: ASGIConnection) -> AuthenticationResult:  # type: ignore[type-arg]
        state: AuthState = connection.app.state.auth
        header = connection.headers.get("authorization")
        if header:
            scheme, _, value = header.partition(" ")
            try:
                if scheme.lower() == "bearer":
                    secret = value.strip()
                elif scheme.lower() == "basic":
                    # Account passwords are never accepted here: git and scripts use a token.
                    secret = _basic_password(value)
                else:
                    raise Unauthenticated("unsupported authorization scheme", code=Code.INVALID_CREDENTIALS)
                principal = await tokens.resolve(state.db, state.token_cache, secret)
            except Unauthenticated as exc:
                actor = Actor(
                    principal=ANONYMOUS,
                    client_addr=client_addr(connection),
                    request_id=request_id(connection),
                )
                await audit.record_refusal(
                    state.db,
                    actor,
                    "auth.token",
                    connection.url.path[:300],
                    reason=exc.code,
                    scheme=scheme.lower()[:10],
                )
                exc.audited = True
                raise
            return AuthenticationResult(user=principal, auth=None)
        sid = connection.cookies.get(websessions.SESSION_COOKIE)
        if sid:
            info = await websessions.resolve(state.db, sid)
            if info is not None:
                return AuthenticationResult(user=info.principal, auth=info)
        return AuthenticationResult(user=ANONYMOUS, auth=None)


class AuthenticationLayer:
    """`AuthMiddleware` with what it raises (a refused token, a busy database) answered right here,
    as Litestar's own session-auth middleware does: the middleware around it (Prometheus) then
    counts the status the client got. Raised further out, the error passed it as a 200."""

    def __init__(self, app: ASGIApp, **options: Any) -> None:
        self.app = ExceptionHandlerMiddleware(app=AuthMiddleware(app, **options), debug=None)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)
