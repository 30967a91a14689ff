"""What every rendered page needs (who is signed in, their CSRF token, whether they are an admin),
for the pages and for the error pages alike: an error page keeps the signed-in header."""

from typing import Any

from litestar.connection import ASGIConnection

from forge import websessions
from forge.access import INSTANCE, Action, Principal, can


def base_context(request: ASGIConnection[Any, Any, Any, Any]) -> dict[str, Any]:
    auth = request.scope.get("auth")
    principal = request.scope.get("user")
    signed_in = isinstance(principal, Principal) and principal.is_authenticated
    return {
        "me": principal if signed_in else None,
        "csrf_token": auth.csrf_token if isinstance(auth, websessions.SessionInfo) else "",
        "is_admin": signed_in and isinstance(principal, Principal) and can(principal, Action.INSTANCE_ADMIN, INSTANCE),
        "request": request,
    }
