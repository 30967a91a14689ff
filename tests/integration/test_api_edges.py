"""Classes of bad input found by fuzzing and hostile raw requests, each tested as a class: every route
that reads a body, every integer parameter. None of them may answer a server error."""

import re
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from litestar import Litestar
from litestar.testing import AsyncTestClient

from forge.json_limits import MAX_JSON_DEPTH, exceeds, max_depth
from tests.support.accounts import Accounts

pytestmark = pytest.mark.db

PARAM = re.compile(r"\{(\w+):(\w+)\}")


def _body_routes(app: Litestar) -> list[tuple[str, str]]:
    """(method, concrete path) of every route that takes a body, path parameters filled in."""
    found = []
    for route in app.routes:
        for method in getattr(route, "methods", ()):
            if method not in ("POST", "PUT", "PATCH"):
                continue
            path = PARAM.sub(lambda m: "1" if m.group(2) == "int" else "x", route.path)
            found.append((method, path))
    return sorted(set(found))


def _deep(levels: int) -> bytes:
    return b'{"a":' * levels + b"1" + b"}" * levels


async def test_every_body_route_refuses_deep_json_with_a_400(
    app: Litestar, client: AsyncTestClient[Any], make: Accounts
) -> None:
    await make.user("root", admin=True)
    headers = {"Authorization": f"Bearer {await make.token('root', 'admin')}", "Content-Type": "application/json"}
    routes = [(m, p) for m, p in _body_routes(app) if not p.endswith(("git-upload-pack", "git-receive-pack"))]
    assert len(routes) > 20, routes  # the API's whole write surface, not a sample
    body = _deep(5_000)  # ~30 KB: far below the body size limit
    for method, path in routes:
        r = await client.request(method, path, content=body, headers=headers)
        assert r.status_code < 500, (method, path, r.status_code, r.text[:200])
        if r.status_code not in (401, 403, 404, 405, 415):
            assert r.status_code == 400 and r.json()["code"] == "json_too_deep", (method, path, r.text[:200])


async def test_deep_json_is_refused_before_anything_is_written(client: AsyncTestClient[Any], make: Accounts) -> None:
    await make.user("ana")
    headers = {"Authorization": f"Bearer {await make.token('ana', 'repo:write')}", "Content-Type": "application/json"}
    body = b'{"name": "deep", "description": ' + b"[" * 3_000 + b"]" * 3_000 + b"}"
    r = await client.post("/api/v1/user/repos", content=body, headers=headers)
    assert r.status_code == 400 and r.json()["code"] == "json_too_deep"
    assert r.headers["content-type"].startswith("application/problem+json")
    listing = await client.get("/api/v1/repos", headers=headers)
    assert listing.json() == []
    # At the limit the body is decoded as usual (here: refused for its shape, never for its depth).
    shallow = b'{"name": "ok", "description": ' + b"[" * (MAX_JSON_DEPTH - 1) + b"]" * (MAX_JSON_DEPTH - 1) + b"}"
    r = await client.post("/api/v1/user/repos", content=shallow, headers=headers)
    assert r.status_code == 422 and r.json()["code"] == "validation_failed", r.text[:300]


def _nest(value: Any, levels: int) -> Any:
    for kind in range(levels):
        value = [value] if kind % 2 else {"k[{": value}
    return value


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(min_value=0, max_value=400), st.text(alphabet='[]{}"\\ab', max_size=20))
def test_depth_measure_matches_the_structure(levels: int, noise: str) -> None:
    import json

    data = json.dumps(_nest(noise, levels)).encode()
    assert max_depth(data) == levels
    assert exceeds(data, MAX_JSON_DEPTH) == (levels > MAX_JSON_DEPTH)
