"""NUL characters in a request's URL: PostgreSQL cannot store them (`forge.core.text`), so a path
or query string that holds one is refused before any handler sees it."""

from typing import Any

from litestar import Request

from forge.core.error_codes import Code
from forge.core.errors import InvalidInput
from forge.core.text import NUL


async def reject_nul_in_url(request: Request[Any, Any, Any]) -> None:
    """`before_request`: paths and query strings with NUL never reach a handler."""
    if NUL in request.url.path or NUL in "".join(f"{k}{v}" for k, v in request.query_params.multi_items()):
        raise InvalidInput("the URL contains a NUL character", code=Code.INVALID_CHARACTERS)
