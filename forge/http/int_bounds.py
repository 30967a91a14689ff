"""Integers in paths and query strings fit the database, or the request never reaches a handler.

Every id and cursor column is an `INTEGER`: signed 64-bit in SQLite, but signed 32-bit in
PostgreSQL, where asyncpg refuses a larger argument; such an id or cursor used to travel to the
driver and come back as a server error (on PostgreSQL from 2**31 on). One `before_request` guard
covers every route, present and future: an integer path parameter out of range names nothing
(404), an integer query parameter out of range is invalid input (422). Bounds a handler declares
itself (`Parameter(ge=..., le=...)`) still apply on top, through Litestar's own validation."""

import functools
from typing import Any, Final

from litestar import Request
from litestar.handlers import BaseRouteHandler
from litestar.params import CookieParameter, HeaderParameter, ParameterKwarg, PathParameter, QueryParameter
from litestar.typing import FieldDefinition

from forge.core.error_codes import Code
from forge.core.errors import InvalidInput, NotFound

# The range both databases hold in an INTEGER column (PostgreSQL's int4).
INT_MIN: Final = -(2**31)
INT_MAX: Final = 2**31 - 1
# int() of a longer string is slow (CPython caps it at 4300 digits and raises); 20 digits hold any int64, so a
# longer one is out of range without converting it.
_MAX_DIGITS: Final = 20


def in_range(value: int) -> bool:
    return INT_MIN <= value <= INT_MAX


@functools.cache
def int_query_keys(handler: BaseRouteHandler) -> frozenset[str]:
    """The query-string keys a handler reads as integers (computed once per handler)."""
    keys = set()
    path_names = _path_param_names(handler)
    for name, param in handler.parsed_fn_signature.parameters.items():
        if name in path_names or not _is_int(param):
            continue
        kwarg = param.kwarg_definition
        if isinstance(kwarg, HeaderParameter | CookieParameter | PathParameter):
            continue
        if isinstance(kwarg, ParameterKwarg) and (kwarg.header or kwarg.cookie):
            continue
        alias = name
        if isinstance(kwarg, QueryParameter) and kwarg.name:
            alias = kwarg.name
        elif isinstance(kwarg, ParameterKwarg) and kwarg.query:
            alias = kwarg.query
        keys.add(alias)
    return frozenset(keys)


def _is_int(field: FieldDefinition) -> bool:
    """`int`, `Annotated[int, ...]` or `int | None` (never `bool`, a subclass of int)."""
    if field.is_optional:
        return any(_is_int(inner) for inner in field.inner_types if inner.annotation is not type(None))
    return field.is_subclass_of(int) and not field.is_subclass_of(bool)


def _path_param_names(handler: BaseRouteHandler) -> set[str]:
    names = set()
    for path in handler.paths:
        for part in path.split("{")[1:]:
            names.add(part.split(":", 1)[0].split("}", 1)[0])
    return names


def _query_int_out_of_range(raw: str) -> bool:
    text = raw.strip()
    digits = text[1:] if text[:1] in "+-" else text
    if not (digits.isascii() and digits.isdigit()):
        return False  # not an integer at all: Litestar's own validation answers it
    return len(digits.lstrip("0")) > _MAX_DIGITS or not in_range(int(text))


async def refuse_out_of_range_ints(request: Request[Any, Any, Any]) -> None:
    """`before_request`: see the module docstring."""
    for value in request.path_params.values():
        if isinstance(value, int) and not isinstance(value, bool) and not in_range(value):
            raise NotFound("not found")
    keys = int_query_keys(request.route_handler)
    if not keys:
        return
    for key, raw in request.query_params.multi_items():
        if key in keys and _query_int_out_of_range(raw):
            raise InvalidInput(f"query parameter {key!r} is out of range", code=Code.OUT_OF_RANGE)
