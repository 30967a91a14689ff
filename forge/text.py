"""Text hygiene at the edges. PostgreSQL cannot store NUL characters (SQLite can): a NUL that
reached a query would be a 500 on one backend and fine on the other. Inputs with NUL are refused
(or, for text that only describes a refusal, cleaned) before they get near the database."""

from typing import Any

from litestar import Request

from forge.error_codes import Code
from forge.errors import InvalidInput

NUL = "\x00"


def without_nul(value: str) -> str:
    return value.replace(NUL, "\ufffd")


def safe_text(value: str) -> str:
    """`value` with what no UTF-8 encoder takes (lone surrogates: a name that is not UTF-8, as
    `os.fsdecode` gives it) written as escapes, so that it can go into JSON and the database."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    return value


def require_no_nul(value: str, what: str) -> str:
    if NUL in value:
        raise InvalidInput(f"{what} must not contain NUL characters", code=Code.INVALID_CHARACTERS)
    return value


async def reject_nul_in_url(request: Request[Any, Any, Any]) -> None:
    """`before_request`: paths and query strings with NUL never reach a handler."""
    if NUL in request.url.path or NUL in "".join(f"{k}{v}" for k, v in request.query_params.multi_items()):
        raise InvalidInput("the URL contains a NUL character", code=Code.INVALID_CHARACTERS)
