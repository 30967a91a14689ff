"""Errors to responses: RFC 9457 problem details for the API (and git), error pages for the web.

Every response that is not a success carries a stable `code`. Unexpected exceptions become a 500
with no internal detail (logged with the request id)."""

from typing import Any
from urllib.parse import quote

import msgspec
import structlog
from litestar import MediaType, Request, Response
from litestar.connection import ASGIConnection
from litestar.exceptions import (
    ClientException,
    HTTPException,
    MethodNotAllowedException,
    NotAuthorizedException,
    NotFoundException,
    PermissionDeniedException,
    ValidationException,
)
from litestar.response import Redirect, Template
from litestar.status_codes import HTTP_500_INTERNAL_SERVER_ERROR
from sqlalchemy.exc import OperationalError
from sqlalchemy.exc import TimeoutError as SQLAlchemyTimeoutError

from forge.core.error_codes import Code, lookup
from forge.core.errors import ForgeError, RateLimited
from forge.db import audit
from forge.git.errors import RepoError
from forge.http.auth import actor_of, request_id
from forge.http.pages.context import SessionTemplate, base_context

log = structlog.get_logger("forgehand")
PROBLEM_JSON = "application/problem+json"
CATCH_ALL_CODES = frozenset({Code.BAD_REQUEST, Code.SERVER_ERROR})


class Problem(msgspec.Struct, kw_only=True, omit_defaults=True):
    type: str = "about:blank"
    title: str
    status: int
    detail: str
    code: str
    request_id: str = ""
    errors: list[dict[str, Any]] | None = None
    # Details some refusals carry (ForgeError extras; see PUBLIC_EXTRAS).
    conflicts: list[dict[str, Any]] | None = None  # merge: the conflicting files
    blockers: list[str] | None = None  # merge: the rules that do not hold
    head_sha: str | None = None  # stale head / commit: the task's head now
    state: str | None = None  # the state that refused the action
    unmet_rules: list[str] | None = None  # pull request merge: every branch rule that does not hold
    number: int | None = None  # pull_request_exists: the open pull request's number
    html_url: str | None = None  # pull_request_exists: its page

    def __post_init__(self) -> None:
        # Every problem response carries a registered code, with its registered status; the two
        # catch-alls stand for whichever 4xx or 5xx the framework raised.
        lookup(self.code, None if self.code in CATCH_ALL_CODES else self.status)


# The ForgeError extras that are part of the API (others stay internal).
PUBLIC_EXTRAS = ("conflicts", "blockers", "head_sha", "state", "unmet_rules", "number", "html_url")


def is_git_request(request: Request[Any, Any, Any]) -> bool:
    """A git smart-HTTP request: routed to a git handler (clone URLs with or without `.git`), or,
    when routing did not get that far, a path that names a `.git` repository."""
    handler = request.scope.get("route_handler")
    if handler is not None and handler.opt.get("git"):
        return True
    path = request.url.path
    return ".git/" in path or path.endswith(".git")


def _wants_html(request: Request[Any, Any, Any]) -> bool:
    if request.url.path.startswith("/api/") or is_git_request(request):
        return False
    return "text/html" in request.headers.get("accept", "")


def _http_code(exc: HTTPException) -> tuple[Code, str]:
    status = exc.status_code
    if isinstance(exc, ValidationException):
        return Code.VALIDATION_FAILED, "Invalid input"
    if type(exc) is ClientException and status == 400:
        # Litestar raises a bare ClientException when the body cannot be decoded at all.
        return Code.MALFORMED_BODY, "Malformed request body"
    if isinstance(exc, NotFoundException):
        return Code.NOT_FOUND, "Not found"
    if isinstance(exc, MethodNotAllowedException):
        return Code.METHOD_NOT_ALLOWED, "Method not allowed"
    if isinstance(exc, NotAuthorizedException):
        return Code.UNAUTHENTICATED, "Authentication required"
    if isinstance(exc, PermissionDeniedException):
        return Code.FORBIDDEN, "Forbidden"
    if status == 413:
        return Code.PAYLOAD_TOO_LARGE, "Payload too large"
    if status == 415:
        return Code.UNSUPPORTED_MEDIA_TYPE, "Unsupported media type"
    if status == 429:
        return Code.RATE_LIMITED, "Too many requests"
    return Code.BAD_REQUEST if status < 500 else Code.SERVER_ERROR, exc.__class__.__name__


def _auth_headers(request: Request[Any, Any, Any], status: int) -> dict[str, str]:
    if status != 401:
        return {}
    if is_git_request(request):
        return {"WWW-Authenticate": 'Basic realm="forgehand", charset="UTF-8"'}
    return {"WWW-Authenticate": 'Bearer realm="forgehand"'}


def handle_forge_error(request: Request[Any, Any, Any], exc: ForgeError) -> Response[Any]:
    problem = Problem(
        title=exc.title,
        status=exc.status,
        detail=exc.detail,
        code=exc.code,
        request_id=request_id(request),
        **{k: exc.extra[k] for k in PUBLIC_EXTRAS if k in exc.extra},
    )
    headers = _auth_headers(request, exc.status)
    if isinstance(exc, RateLimited):
        headers["Retry-After"] = str(exc.retry_after)
    return _render(request, problem, headers)


def handle_http_exception(request: Request[Any, Any, Any], exc: HTTPException) -> Response[Any]:
    code, title = _http_code(exc)
    status = exc.status_code
    detail = str(exc.detail) if exc.detail else title
    errors = None
    if isinstance(exc, ValidationException):
        # Unparseable or schema-invalid bodies are 4xx; Litestar reports them as 400.
        status = 422
        extra = exc.extra
        if isinstance(extra, list):
            errors = [e for e in extra if isinstance(e, dict)]
    if status >= 500:
        detail = "internal server error"
    if status == 413:
        detail = _too_large(request)
    problem = Problem(
        title=title, status=status, detail=detail, code=code, request_id=request_id(request), errors=errors
    )
    headers = dict(exc.headers or {})
    headers.update(_auth_headers(request, status))
    return _render(request, problem, headers)


def _too_large(request: Request[Any, Any, Any]) -> str:
    """A body over the server's limit: name the limit, so the sender knows how much to cut."""
    settings = getattr(request.app.state, "settings", None)
    limit = getattr(settings, "max_body_bytes", None)
    if not isinstance(limit, int):
        return "the request body is larger than this server takes"
    return (
        f"the request body is larger than the limit of {limit:,} bytes (FORGEHAND_MAX_BODY_BYTES); "
        "text fields have their own limits, e.g. 65,536 characters for an issue, pull request or comment body"
    )


def handle_unexpected(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    rid = request_id(request)
    log.exception("unhandled error", request_id=rid, path=request.url.path, exc_info=exc)
    problem = Problem(
        title="Internal server error",
        status=HTTP_500_INTERNAL_SERVER_ERROR,
        detail="internal server error",
        code=Code.SERVER_ERROR,
        request_id=rid,
    )
    return _render(request, problem, {})


def _render(request: Request[Any, Any, Any], problem: Problem, headers: dict[str, str]) -> Response[Any]:
    # The security headers are added to every response on its way out (forge.http.edges).
    headers = {**headers, "X-Request-Id": problem.request_id}
    if _wants_html(request) and problem.status == 401 and request.method == "GET":
        target = quote(request.url.path + (f"?{request.url.query}" if request.url.query else ""), safe="")
        return Redirect(f"/signin?next={target}", status_code=303)
    if _wants_html(request):
        # No `user` in the scope: routing refused the path before the auth middleware ran.
        page_class = Template if "user" in request.scope else SessionTemplate
        return page_class(
            template_name="error.html",
            context={**base_context(request), "problem": problem},
            status_code=problem.status,
            headers=headers,
            media_type=MediaType.HTML,
        )
    return Response(
        content=msgspec.json.encode(problem),
        status_code=problem.status,
        media_type=PROBLEM_JSON,
        headers=headers,
    )


def handle_bad_encoding(request: Request[Any, Any, Any], exc: UnicodeDecodeError) -> Response[Any]:
    # A body that is not UTF-8 fails in the framework's decoder, before any handler runs.
    problem = Problem(
        title="Invalid input",
        status=422,
        detail="the request body is not valid UTF-8",
        code=Code.INVALID_ENCODING,
        request_id=request_id(request),
    )
    return _render(request, problem, {})


def handle_database_busy(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    """The connection pool stayed full (or SQLite's write lock stayed taken) for the whole wait:
    the server is busy, nothing went wrong, and the client may retry."""
    if isinstance(exc, OperationalError) and "database is locked" not in str(exc.orig):
        return handle_unexpected(request, exc)
    log.warning("database busy", request_id=request_id(request), path=request.url.path, error=type(exc).__name__)
    problem = Problem(
        title="Service unavailable",
        status=503,
        detail="the server is busy; retry in a moment",
        code=Code.DATABASE_BUSY,
        request_id=request_id(request),
    )
    return _render(request, problem, {"Retry-After": "1"})


EXCEPTION_HANDLERS: dict[type[Exception] | int, Any] = {
    SQLAlchemyTimeoutError: handle_database_busy,
    OperationalError: handle_database_busy,
    ForgeError: handle_forge_error,
    UnicodeDecodeError: handle_bad_encoding,
    HTTPException: handle_http_exception,
    Exception: handle_unexpected,
}


async def audit_refusal(exc: Exception, scope: Any) -> None:
    """`after_exception` hook: every refused attempt leaves an audit row."""
    if not isinstance(exc, ForgeError) or exc.audited:
        return
    if exc.status not in {401, 403, 429} and not exc.extra.get("refused"):
        return
    connection: ASGIConnection[Any, Any, Any, Any] = ASGIConnection(scope)
    exc.audited = True
    await audit.record_refusal(
        connection.app.state.db,
        actor_of(connection),
        "access.denied",
        connection.url.path[:300],
        code=exc.code,
        method=scope.get("method", ""),
        status=exc.status,
    )


def handle_repo_error(request: Request[Any, Any, Any], exc: RepoError) -> Response[Any]:
    """Errors of the git layer: their stable codes are registered with their HTTP statuses."""
    status = lookup(exc.code).status
    detail = str(exc) if status < 500 else "the git operation failed"
    if status >= 500:
        log.error("git layer error", request_id=request_id(request), code=exc.code, error=str(exc))
    problem = Problem(
        title="Git error" if status >= 500 else "Invalid request",
        status=status,
        detail=detail,
        code=exc.code,
        request_id=request_id(request),
    )
    return _render(request, problem, {})


EXCEPTION_HANDLERS[RepoError] = handle_repo_error
