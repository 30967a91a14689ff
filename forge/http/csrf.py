"""CSRF protection for cookie-authenticated requests.

A request authenticated by the session cookie must echo the session's CSRF token (form field
`csrf_token` or header `X-CSRF-Token`) on every unsafe method. Before sign-in, forms marked
`opt={"csrf": "presession"}` use a double-submit cookie. Token and Basic requests carry no
ambient authority and need no CSRF token."""

from typing import Any

from litestar import Request

from forge.accounts import websessions
from forge.accounts.websessions import SessionInfo
from forge.core.error_codes import Code
from forge.core.errors import Forbidden
from forge.db import audit
from forge.http.auth import actor_of
from forge.http.deps import SAFE_METHODS

FIELD = "csrf_token"
HEADER = "x-csrf-token"


async def _given(request: Request[Any, Any, Any]) -> str | None:
    header = request.headers.get(HEADER)
    if header:
        return header
    ctype = request.headers.get("content-type", "")
    if request.route_handler.opt.get("git"):
        return None  # never buffer a git body to look for a form field
    if ctype.startswith(("application/x-www-form-urlencoded", "multipart/form-data")):
        value = (await request.form()).get(FIELD)
        return value if isinstance(value, str) else None
    return None


async def check_csrf(request: Request[Any, Any, Any]) -> None:
    if request.method in SAFE_METHODS:
        return
    auth = request.scope.get("auth")
    if request.route_handler.opt.get("csrf") == "presession":
        # The sign-in form carries the pre-session token, also when someone is signed in already.
        expected = request.cookies.get(websessions.PRESESSION_COOKIE, "")
    elif isinstance(auth, SessionInfo):
        expected = auth.csrf_token
    else:
        return
    if not websessions.tokens_match(expected, await _given(request)):
        actor = actor_of(request)
        await audit.record_refusal(request.app.state.db, actor, "auth.csrf", request.url.path[:300])
        exc = Forbidden(
            "the form has expired or did not come from this site; reload and try again", code=Code.CSRF_FAILED
        )
        exc.audited = True
        raise exc
