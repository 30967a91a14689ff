"""What every rendered page needs (who is signed in, their CSRF token, whether they are an admin),
for the pages and for the error pages alike: an error page keeps the signed-in header."""

from typing import Any

from litestar import Request
from litestar.connection import ASGIConnection
from litestar.response import Template
from litestar.response.base import ASGIResponse
from litestar.types import Receive, Scope, Send

from forge.accounts import websessions
from forge.core.access import INSTANCE, Action, Principal, can


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


class _SessionFirst(ASGIResponse):
    """Resolves the session cookie, then renders and sends the page (see `SessionTemplate`)."""

    def __init__(self, template: "SessionTemplate", request: Request[Any, Any, Any], options: dict[str, Any]) -> None:
        super().__init__(body=b"")
        self._template, self._request, self._options = template, request, options

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = self._request
        sid = request.cookies.get(websessions.SESSION_COOKIE)
        info = await websessions.resolve(request.app.state.db, sid) if sid else None
        if info is not None:
            request.scope["user"], request.scope["auth"] = info.principal, info
        self._template.context.update(base_context(request))
        rendered = Template.to_asgi_response(self._template, None, request, **self._options)
        await rendered(scope, receive, send)


class SessionTemplate(Template):
    """A page for a request that routing refused before any middleware ran (an unknown path):
    the auth middleware never saw it, so the session cookie is resolved here, when the response
    is sent, and the page still shows who is signed in."""

    def to_asgi_response(self, app: Any, request: Request[Any, Any, Any], **options: Any) -> ASGIResponse:
        return _SessionFirst(self, request, options)
