"""What the REST API promises, written down where a client generator and a fuzzer read it.

Litestar's generated OpenAPI document lists only the success status of each operation and a 400
shape the server never sends. `ContractJsonPlugin` serves the same document completed from the
rules the server actually follows:

- every refusal is `application/problem+json` (`forge.http.problems.Problem`), and each operation
  declares the refusal statuses it can answer (derived from what the operation has: path
  parameters can name nothing (404), a body or a query can be malformed or invalid (400/413/422),
  writes can conflict (409), every caller can be unauthenticated (401) or lack the role or scope
  (403), task writes ask policy hooks (502));
- the security schemes (bearer token, browser session cookie; anonymous reads of public
  repositories);
- request bodies that refuse unknown fields say `additionalProperties: false`;
- closed vocabularies (token scopes, webhook events, error codes) are enums;
- integers in paths and queries carry the signed 32-bit bounds that `forge.http.int_bounds` enforces.

A render plugin is Litestar's public hook for what `/api/schema/openapi.json` returns; the document
is completed and encoded once per process (every app built by `forge.app.factory.create_app` has the same
routes) and cached: `ContractJsonPlugin.contract`, which `forge.http.api.reference` also calls ahead of
the first request, off the event loop.
"""

import copy
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import msgspec
from litestar import Litestar, Request
from litestar.openapi.plugins import JsonRenderPlugin
from litestar.serialization import encode_json

from forge.accounts.websessions import SESSION_COOKIE
from forge.core.error_codes import BY_VALUE
from forge.http.int_bounds import INT_MAX, INT_MIN
from forge.http.problems import PROBLEM_JSON, Problem

WRITE_METHODS = frozenset({"post", "put", "patch", "delete"})
DESCRIPTIONS = {
    "400": "Malformed request (body not JSON, JSON nested too deeply, bad query)",
    "401": "No valid credentials (send a token: `Authorization: Bearer ...`)",
    "403": "The caller may not do this (role, token scope, CSRF)",
    "404": "Nothing by that name, or the caller may not read it",
    "409": "Conflicts with the current state",
    "413": "Body too large",
    "415": "Body is not JSON",
    "422": "Input does not validate (see `errors`), or the URL has invalid characters",
    "502": "A policy hook could not be asked or refused to answer (failure policy `closed`)",
    "503": "Busy (retry after `Retry-After`), or a service this needs is not set up",
}


class ContractJsonPlugin(JsonRenderPlugin):
    """`/openapi.json`, completed (see the module docstring)."""

    # The encoded contract per route table (one per process in practice), shared by every app.
    _cache: dict[tuple[str, ...], bytes] = {}
    _lock = threading.Lock()

    def __init__(self, *, enums: Mapping[str, Sequence[str]], codes: Sequence[str] = (), **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._enums = dict(enums)
        self._codes = list(codes)

    def render(self, request: Request[Any, Any, Any], openapi_schema: dict[str, Any]) -> bytes:
        return self.contract(request.app, openapi_schema)

    def contract(self, app: Litestar, openapi_schema: dict[str, Any]) -> bytes:
        """The completed document, encoded: built on the first call for these routes, then cached."""
        key = route_key(app)
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        with self._lock:
            if key not in self._cache:
                completed = complete(
                    openapi_schema, strict_bodies=strict_body_names(app), enums=self._enums, codes=self._codes
                )
                self._cache[key] = encode_json(completed)
            return self._cache[key]


def route_key(app: Litestar) -> tuple[str, ...]:
    """What the OpenAPI document of an app depends on: its routes and their methods."""
    return tuple(sorted(f"{route.path} {' '.join(sorted(getattr(route, 'methods', ())))}" for route in app.routes))


def strict_body_names(app: Litestar) -> set[str]:
    """Names of the request-body structs that forbid unknown fields (their schema component names)."""
    names = set()
    for route in app.routes:
        for handler in getattr(route, "route_handlers", []):
            data = handler.parsed_fn_signature.parameters.get("data")
            cls = getattr(data, "annotation", None)
            if not (isinstance(cls, type) and issubclass(cls, msgspec.Struct)):
                continue
            if cls.__struct_config__.forbid_unknown_fields:
                names.add(cls.__name__)
    return names


def _code_line(code: str) -> str:
    entry = BY_VALUE.get(code)
    if entry is None:
        return f"- `{code}`"
    return f"- `{code}` ({', '.join(map(str, entry.statuses))}): {entry.meaning}"


def problem_schema(codes: Sequence[str]) -> dict[str, Any]:
    schema: dict[str, Any] = msgspec.json.schema(Problem)["$defs"]["Problem"]
    schema["additionalProperties"] = False
    if codes:
        code = schema["properties"]["code"]
        code["enum"] = sorted(codes)
        # What each code means, where a person reading the API reference looks for it.
        listing = "\n".join(_code_line(c) for c in sorted(codes))
        code["description"] = f"A stable code to branch on (the `detail` is for people). Every code:\n\n{listing}"
    return schema


def _statuses(method: str, path: str, operation: Mapping[str, Any]) -> list[str]:
    params = operation.get("parameters", [])
    has_body = "requestBody" in operation
    has_query = any(p.get("in") == "query" for p in params)
    # Every operation: 422 (a URL with a NUL character is invalid input wherever it points) and 503
    # (the database pool stayed full: retry after `Retry-After`).
    out = ["401", "403", "422", "503"]
    if has_body or has_query or "400" in operation.get("responses", {}):
        out.append("400")
    if has_body:
        out += ["413", "415"]
    if "{" in path or has_body:
        out.append("404")  # a path names a resource; so may a body (a bot's owner, a collaborator)
    if method in WRITE_METHODS:
        out.append("409")
        if "/tasks" in path:
            out.append("502")
    return sorted(set(out))


def _bound_integers(schema: dict[str, Any]) -> None:
    """Signed 32-bit bounds (`forge.http.int_bounds`) on an integer schema (or an `integer | null` one)
    that has none."""
    kinds = [schema.get("type")] + [alt.get("type") for alt in schema.get("oneOf", [])]
    if "integer" in kinds:
        schema.setdefault("minimum", INT_MIN)
        schema.setdefault("maximum", INT_MAX)


def _enum_items(component: dict[str, Any], field: str, values: Iterable[str]) -> None:
    prop = component.get("properties", {}).get(field)
    if prop is None:
        return
    target = prop
    for alt in prop.get("oneOf", []):
        if alt.get("type") == "array":
            target = alt
    if target.get("type") == "array":
        target.setdefault("items", {})["enum"] = sorted(values)
    else:
        target["enum"] = sorted(values)


def complete(
    document: Mapping[str, Any],
    *,
    strict_bodies: Iterable[str],
    enums: Mapping[str, Sequence[str]],
    codes: Sequence[str] = (),
) -> dict[str, Any]:
    """A completed copy of Litestar's document (the input is left as it is)."""
    doc = copy.deepcopy(dict(document))
    components = doc.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    schemas["Problem"] = problem_schema(codes)
    components["securitySchemes"] = {
        "token": {"type": "http", "scheme": "bearer", "description": "A personal or bot access token (Tokens page)"},
        "session": {"type": "apiKey", "in": "cookie", "name": SESSION_COOKIE, "description": "Browser sign-in"},
    }
    # `{}`: anonymous callers may read public repositories.
    doc["security"] = [{"token": []}, {"session": []}, {}]
    for name in strict_bodies:
        if name in schemas:
            schemas[name]["additionalProperties"] = False
    for dotted, values in enums.items():
        component, _, field = dotted.partition(".")
        if component in schemas:
            _enum_items(schemas[component], field, values)

    problem = {PROBLEM_JSON: {"schema": {"$ref": "#/components/schemas/Problem"}}}
    for path, item in doc.get("paths", {}).items():
        for method, operation in item.items():
            if not isinstance(operation, dict) or "responses" not in operation:
                continue
            responses = operation["responses"]
            for status in _statuses(method, path, operation):
                responses[status] = {"description": DESCRIPTIONS[status], "content": problem}
            for param in operation.get("parameters", []):
                if param.get("in") in ("path", "query") and "schema" in param:
                    _bound_integers(param["schema"])
    return doc
