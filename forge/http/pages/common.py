"""What every page module uses: the page helper (`page`, which also shows a refused form), the
one way a form's action turns a refusal into that page (`or_form_error`), the base of a posted
form (`WebForm`), the instance-admin guard and the check of a `next` target.
Pages are thin: parse, authorize, call the same services as the REST API, render. Forms work
without JavaScript (POST + redirect); `signed_in` is `forge.http.auth`'s, for pages and API alike."""

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import msgspec
from litestar import Request
from litestar.connection import ASGIConnection
from litestar.handlers import BaseRouteHandler
from litestar.response import Template

from forge.core.access import INSTANCE, Action, require
from forge.core.errors import ForgeError
from forge.http.auth import signed_in
from forge.http.pages.context import base_context

Done = TypeVar("Done")


def page(
    request: Request[Any, Any, Any],
    name: str,
    status_code: int = 200,
    *,
    refused: ForgeError | None = None,
    **context: Any,
) -> Template:
    """Render a page with what every page needs (who is signed in, the CSRF token).

    `refused`: the service's refusal of the form the page shows again, the one way a page turns a
    `ForgeError` into what it shows: the error's status, its message as `error` (the form's alert;
    `forms.form_errors` also places it at the input it concerns) and, for a rate limit, the
    `Retry-After` the API sends too."""
    headers: dict[str, str] = {}
    if refused is not None:
        status_code = refused.status
        context["error"] = refused.detail
        if refused.status == 429:
            headers["Retry-After"] = str(getattr(refused, "retry_after", 60))
    return Template(
        template_name=name,
        context={**base_context(request), **context},
        status_code=status_code,
        headers=headers or None,
    )


async def or_form_error(
    action: Awaitable[Done], again: Callable[[ForgeError], Awaitable[Template]], *, raise_404: bool = True
) -> Done | Template:
    """A form's action, or what `again(exc)` renders when the action is refused with a `ForgeError`
    (the page again, the refusal beside the field it concerns). A 404 stays a 404 (the error page),
    unless `raise_404=False`: then the form shows it too (an input named what does not exist)."""
    try:
        return await action
    except ForgeError as exc:
        if raise_404 and exc.status == 404:
            raise
        return await again(exc)


class WebForm(msgspec.Struct, kw_only=True):
    """A form posted by a page. `forge.http.csrf` checks the token before any handler runs."""

    csrf_token: str = ""


def instance_admin(connection: ASGIConnection[Any, Any, Any, Any], handler: BaseRouteHandler) -> None:
    """Guard: pages for instance admins."""
    signed_in(connection, handler)
    require(connection.scope["user"], Action.INSTANCE_ADMIN, INSTANCE)


def safe_next(value: str) -> str:
    # Only same-site paths: no scheme, no host, no protocol-relative `//evil`.
    if not value.startswith("/") or value.startswith("//") or "\\" in value:
        return "/"
    return value
