"""The app's edges: `before_request`, the checks every request passes, in order, before any
handler runs, and `add_security_headers`, the headers every response leaves with.

Each check lives with its concern; this module only fixes their order. A check raises a
`ForgeError` (rendered as problem details or an error page) or, for `OPTIONS`, answers itself."""

from typing import Any

from litestar import Request, Response
from litestar.datastructures import ResponseHeader
from litestar.status_codes import HTTP_204_NO_CONTENT
from litestar.types import Message, Scope

from forge.http.api.reference import before_schema
from forge.http.csrf import check_csrf
from forge.http.int_bounds import refuse_out_of_range_ints
from forge.http.json_limits import refuse_deep_json
from forge.http.nul_in_url import reject_nul_in_url
from forge.http.pages.password_gate import require_own_password

# Headers on every response. Images only from this instance (or inline data): text an untrusted
# agent or repository wrote is rendered as markdown, and an image address is a way to send what
# it knows to any host the moment a reviewer opens the page. No framing by other sites, no
# content sniffing (raw repository files are served as they are), no full URLs in referrers.
SECURITY_HEADERS = [
    ResponseHeader(name="Content-Security-Policy", value="img-src 'self' data:; frame-ancestors 'none'"),
    ResponseHeader(name="X-Content-Type-Options", value="nosniff"),
    ResponseHeader(name="Referrer-Policy", value="same-origin"),
]
_SECURITY_RAW = [(h.name.lower().encode(), (h.value or "").encode()) for h in SECURITY_HEADERS]


async def add_security_headers(message: Message, scope: Scope) -> None:
    """The app's `before_send` hook: the security headers on every response, whatever answered it
    (a handler, an exception handler, routing's own 404 and 405, static files). A response that
    sets one itself (raw repository files: a stricter CSP) keeps its own."""
    if message["type"] != "http.response.start":
        return
    headers = list(message.get("headers") or [])
    present = {bytes(name).lower() for name, _ in headers}
    message["headers"] = headers + [h for h in _SECURITY_RAW if h[0] not in present]


def options_response(request: Request[Any, Any, Any]) -> Response[None] | None:
    """`OPTIONS` answers every method its path serves.

    Litestar keeps one route per handler registration and answers `OPTIONS` from the last one, so
    a path served by several controllers (GET in one, PATCH in another) listed only some."""
    if request.method != "OPTIONS":
        return None
    template = request.scope.get("path_template")
    methods = {"OPTIONS"}
    for route in request.app.routes:
        if route.path_format == template:
            methods.update(getattr(route, "methods", ()))
    return Response(None, status_code=HTTP_204_NO_CONTENT, headers={"Allow": ", ".join(sorted(methods))})


async def before_request(request: Request[Any, Any, Any]) -> Response[Any] | None:
    await reject_nul_in_url(request)
    await refuse_out_of_range_ints(request)
    if (answer := options_response(request)) is not None:
        return answer
    await check_csrf(request)
    if (answer := await require_own_password(request)) is not None:
        return answer
    await refuse_deep_json(request)
    await before_schema(request)
    return None
