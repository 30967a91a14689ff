"""A generated password must be changed at first sign-in (`Account.must_change_password`: the
first admin's, and an account an admin created or reset with "generate one"). Until it is, a
browser session reaches only the password page, signing out (or in as someone else) and the API
reference: every other page redirects to `/settings/password` (which says why), and the REST API
answers 403 `password_change_required` to the session. Tokens are not affected: they are separate
credentials someone chose to create, and scripts must not break because a person has not signed
in yet."""

from typing import Any
from urllib.parse import quote

from litestar import Request, Response
from litestar.response import Redirect

from forge.accounts.websessions import SessionInfo
from forge.core.error_codes import Code
from forge.core.errors import Forbidden

PASSWORD_PAGE = "/settings/password"
# The header's unread badge is fetched by every page, the password page included: a count, nothing
# to keep from someone who has not changed their password yet.
_OPEN_PATHS = frozenset({PASSWORD_PAGE, "/settings/account/password", "/signout", "/signin", "/notifications/badge"})
_OPEN_PREFIXES = ("/api/schema", "/static/")


def must_change(request: Request[Any, Any, Any]) -> bool:
    auth = request.scope.get("auth")
    return isinstance(auth, SessionInfo) and auth.must_change_password


async def require_own_password(request: Request[Any, Any, Any]) -> Response[Any] | None:
    """`before_request`: `None` lets the request through; otherwise the redirect (a page) or a
    403 (the API) for a session whose password is still the generated one."""
    if not must_change(request):
        return None
    path = request.url.path.rstrip("/") or "/"
    if path in _OPEN_PATHS or path.startswith(_OPEN_PREFIXES):
        return None
    if path.startswith("/api/"):
        raise Forbidden(
            "your password was generated: change it at /settings/password in the browser first "
            "(tokens keep working meanwhile)",
            code=Code.PASSWORD_CHANGE_REQUIRED,
        )
    target = PASSWORD_PAGE
    if request.method == "GET" and path != "/":
        target += "?next=" + quote(path + (f"?{request.url.query}" if request.url.query else ""), safe="")
    if request.headers.get("hx-request"):
        # htmx would swap the password page into a fragment: have it load the whole page instead.
        return Response(None, status_code=200, headers={"HX-Redirect": target})
    return Redirect(target, status_code=303)
