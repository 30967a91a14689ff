"""The OpenAPI document describes the API the server runs: refusal statuses and their problem-details
body, security schemes, closed bodies, enums, integer bounds, and an `Allow` that lists every method."""

import re
from typing import Any

import msgspec
from litestar import Litestar
from litestar.testing import AsyncTestClient

from forge.core.access import Scope
from forge.http.int_bounds import INT_MAX, INT_MIN
from webhooks.sdk.protocol import NOTIFY_EVENTS, POLICY_EVENTS

METHODS = ("get", "post", "put", "patch", "delete")


async def _document(client: AsyncTestClient[Any]) -> dict[str, Any]:
    r = await client.get("/api/schema/openapi.json")
    assert r.status_code == 200
    return dict(r.json())


def _operations(doc: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(m, p, op) for p, item in doc["paths"].items() for m, op in item.items() if m in METHODS]


async def test_every_refusal_status_is_declared_with_the_problem_schema(client: AsyncTestClient[Any]) -> None:
    doc = await _document(client)
    ops = _operations(doc)
    assert len(ops) > 60
    problem = doc["components"]["schemas"]["Problem"]
    assert set(problem["required"]) == {"title", "status", "detail", "code"}
    for method, path, op in ops:
        declared = set(op["responses"])
        assert {"401", "403"} <= declared, (method, path)
        if "{" in path:
            assert "404" in declared, (method, path)
        if "requestBody" in op:
            assert {"400", "413", "415", "422"} <= declared, (method, path)
            assert "additionalProperties" not in op["requestBody"]  # the component carries it
        if method != "get":
            assert "409" in declared, (method, path)
        for status, response in op["responses"].items():
            if int(status) >= 400:
                assert response["content"] == {
                    "application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}
                }, (method, path, status)


async def test_security_schemes_and_anonymous_reads(client: AsyncTestClient[Any]) -> None:
    doc = await _document(client)
    schemes = doc["components"]["securitySchemes"]
    assert schemes["token"] == {**schemes["token"], "type": "http", "scheme": "bearer"}
    assert schemes["session"]["in"] == "cookie"
    assert {} in doc["security"]


async def test_bodies_that_refuse_unknown_fields_say_so(app: Litestar, client: AsyncTestClient[Any]) -> None:
    doc = await _document(client)
    schemas = doc["components"]["schemas"]
    checked = 0
    for route in app.routes:
        for handler in getattr(route, "route_handlers", []):
            data = handler.parsed_fn_signature.parameters.get("data")
            cls = getattr(data, "annotation", None)
            if not handler.include_in_schema or not (isinstance(cls, type) and issubclass(cls, msgspec.Struct)):
                continue
            if cls.__struct_config__.forbid_unknown_fields:
                assert schemas[cls.__name__].get("additionalProperties") is False, cls.__name__
                checked += 1
    assert checked >= 15


async def test_closed_vocabularies_are_enums(client: AsyncTestClient[Any]) -> None:
    schemas = (await _document(client))["components"]["schemas"]
    assert schemas["TokenCreate"]["properties"]["scopes"]["items"]["enum"] == sorted(s.value for s in Scope)
    events = sorted((*POLICY_EVENTS, *NOTIFY_EVENTS))
    assert schemas["HookCreate"]["properties"]["events"]["items"]["enum"] == events
    update = schemas["HookUpdate"]["properties"]["events"]
    arrays = [alt for alt in update.get("oneOf", [update]) if alt.get("type") == "array"]
    assert arrays and arrays[0]["items"]["enum"] == events


async def test_integer_parameters_carry_bounds(client: AsyncTestClient[Any]) -> None:
    doc = await _document(client)
    seen = 0
    for method, path, op in _operations(doc):
        for param in op.get("parameters", []):
            schema = param.get("schema", {})
            kinds = [schema.get("type")] + [alt.get("type") for alt in schema.get("oneOf", [])]
            if "integer" in kinds:
                seen += 1
                assert schema["minimum"] >= INT_MIN and schema["maximum"] <= INT_MAX, (method, path, param["name"])
    assert seen > 30


async def test_options_lists_every_documented_method(client: AsyncTestClient[Any]) -> None:
    doc = await _document(client)
    for path, item in doc["paths"].items():
        concrete = re.sub(r"\{[^}]+\}", "1", path)
        r = await client.options(concrete)
        assert r.status_code == 204, path
        allowed = {m.strip() for m in r.headers["allow"].split(",")}
        documented = {m.upper() for m in item if m in METHODS}
        assert documented | {"OPTIONS"} <= allowed, (path, allowed, documented)
