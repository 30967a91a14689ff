"""Classes of bad input found by fuzzing and hostile raw requests, each tested as a class: every route
that reads a body, every integer parameter. None of them may answer a server error."""

import re
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from litestar import Litestar
from litestar.testing import AsyncTestClient

from forge.http.int_bounds import INT_MAX, INT_MIN
from forge.http.json_limits import MAX_JSON_DEPTH, exceeds
from tests.support.accounts import Accounts
from webhooks.sdk.protocol import max_depth

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


HUGE = (INT_MAX + 1, INT_MIN - 1, 10**40)
NAMED = {"owner": "root", "name": "demo", "number": "1", "login": "root"}


def _fill(path: str, int_value: int) -> str:
    return PARAM.sub(lambda m: str(int_value) if m.group(2) == "int" else NAMED.get(m.group(1), "x"), path)


async def _admin_world(client: AsyncTestClient[Any], make: Accounts) -> dict[str, str]:
    await make.user("root", admin=True)
    headers = {"Authorization": f"Bearer {await make.token('root', 'admin')}"}
    r = await client.post("/api/v1/user/repos", json={"name": "demo", "auto_init": True}, headers=headers)
    assert r.status_code == 201, r.text
    return headers


async def test_integer_path_parameters_out_of_range_are_404(
    app: Litestar, client: AsyncTestClient[Any], make: Accounts
) -> None:
    headers = await _admin_world(client, make)
    checked = 0
    for route in app.routes:
        if ":int}" not in route.path:
            continue
        for method in sorted(getattr(route, "methods", ())):
            if method in ("OPTIONS", "HEAD"):
                continue
            for value in HUGE:
                path = _fill(route.path, value)
                r = await client.request(method, path, headers=headers, json={})
                assert r.status_code == 404, (method, path, r.status_code, r.text[:200])
                checked += 1
    assert checked > 60, checked  # webhooks, deliveries, branch rules, tokens: the whole class


async def test_integer_query_parameters_out_of_range_are_422(
    app: Litestar, client: AsyncTestClient[Any], make: Accounts
) -> None:
    from forge.http.int_bounds import int_query_keys

    headers = await _admin_world(client, make)
    checked = 0
    for route in app.routes:
        for handler in getattr(route, "route_handlers", []):
            for key in int_query_keys(handler):
                for method in sorted(handler.http_methods):
                    for value in HUGE:
                        path = _fill(route.path, 1)
                        r = await client.request(method, path, params={key: str(value)}, headers=headers)
                        assert r.status_code == 422, (method, path, key, r.status_code, r.text[:200])
                        assert r.json()["code"] in ("out_of_range", "validation_failed")
                        checked += 1
    assert checked >= 15, checked  # audit cursor and limit, deliveries, commits, transcript pages


def _unbounded_ints(info: Any, where: str, seen: set[type]) -> list[str]:
    import msgspec.inspect as mi

    if isinstance(info, mi.IntType):
        low = info.ge is not None or info.gt is not None
        high = info.le is not None or info.lt is not None
        return [] if low and high else [where]
    if isinstance(info, mi.StructType):
        if info.cls in seen:
            return []
        seen.add(info.cls)
        return [x for f in info.fields for x in _unbounded_ints(f.type, f"{info.cls.__qualname__}.{f.name}", seen)]
    if isinstance(info, mi.ListType | mi.SetType | mi.FrozenSetType | mi.VarTupleType):
        return _unbounded_ints(info.item_type, where + "[]", seen)
    if isinstance(info, mi.DictType):
        return _unbounded_ints(info.value_type, where + "{}", seen)
    if isinstance(info, mi.UnionType):
        return [x for t in info.types for x in _unbounded_ints(t, where, seen)]
    if isinstance(info, mi.TupleType):
        return [x for t in info.item_types for x in _unbounded_ints(t, where, seen)]
    return []


def test_every_integer_in_a_request_body_has_bounds(app: Litestar) -> None:
    import msgspec.inspect as mi

    bodies = 0
    unbounded: list[str] = []
    for route in app.routes:
        for handler in getattr(route, "route_handlers", []):
            data = handler.parsed_fn_signature.parameters.get("data")
            if data is not None:
                bodies += 1
                unbounded += _unbounded_ints(mi.type_info(data.annotation), route.path, set())
    assert bodies > 30
    assert unbounded == []


async def test_anonymous_calls_to_account_endpoints_are_401(app: Litestar, client: AsyncTestClient[Any]) -> None:
    """Instance administration and the caller's own resources exist on every server: an anonymous
    caller is asked to authenticate (401, so clients prompt for a token), never told 403 or 422."""
    checked = 0
    for route in app.routes:
        if not route.path.startswith(("/api/v1/admin", "/api/v1/user")):
            continue
        for method in sorted(set(getattr(route, "methods", ())) - {"OPTIONS", "HEAD"}):
            r = await client.request(method, _fill(route.path, 1), json={})
            assert r.status_code == 401, (method, route.path, r.status_code, r.text[:200])
            assert r.json()["code"] == "unauthenticated"
            checked += 1
    assert checked >= 20, checked


async def test_a_full_write_pool_is_a_503_with_retry_after_and_reads_go_on(app: Litestar, make: Accounts) -> None:
    """Back-pressure, not a server error: while every connection of the write pool is taken, a write
    waits the pool timeout (5 s, not 30) and is answered 503 `database_busy` with `Retry-After`;
    reads have a pool of their own and go on meanwhile (a fresh token's last-use note included)."""
    import time

    from forge.db.engine import POOL_TIMEOUT_SECONDS, SQLITE_WRITE_POOL, WRITE_POOL_MAX_OVERFLOW, WRITE_POOL_SIZE

    await make.user("ana")
    token = {"Authorization": f"Bearer {await make.token('ana', 'repo:write')}"}
    async with AsyncTestClient(app) as client:
        db = app.state.db
        size = SQLITE_WRITE_POOL if db.url.startswith("sqlite") else WRITE_POOL_SIZE + WRITE_POOL_MAX_OVERFLOW

        # Taken and given back on the app's own event loop (the test client runs the app in a portal
        # thread): asyncpg connections cannot cross loops.
        async def take() -> list[Any]:
            return [await db.write_engine.connect() for _ in range(size)]

        async def give_back(conns: list[Any]) -> None:
            for conn in conns:
                await conn.close()

        held = client.blocking_portal.call(take)
        try:
            read = await client.get("/api/v1/repos", headers=token)
            started = time.monotonic()
            r = await client.post("/api/v1/user/repos", json={"name": "busy"}, headers=token)
            waited = time.monotonic() - started
        finally:
            client.blocking_portal.call(give_back, held)
        assert read.status_code == 200, read.text
        assert r.status_code == 503, r.text
        assert r.json()["code"] == "database_busy" and r.headers["retry-after"] == "1"
        assert waited < POOL_TIMEOUT_SECONDS * 3
        again = await client.post("/api/v1/user/repos", json={"name": "busy"}, headers=token)
        assert again.status_code == 201, again.text


async def test_a_busy_database_while_authenticating_is_a_503_and_counted_as_one(
    app: Litestar, make: Accounts, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The authentication middleware answers its own errors (forge.http.auth.AuthenticationLayer):
    a token lookup that meets a full pool is a 503 `database_busy` to the client and in `/metrics`,
    never counted as the 200 it used to pass for."""
    from sqlalchemy.exc import TimeoutError as PoolTimeout

    from forge.accounts import tokens

    async def busy(*args: Any, **kwargs: Any) -> Any:
        raise PoolTimeout("QueuePool limit reached")

    def counted(metrics: str) -> dict[str, int]:
        out: dict[str, int] = {}
        for line in metrics.splitlines():
            if line.startswith("forgehand_requests_total{") and 'path="/api/v1/user"' in line:
                status = re.search(r'status_code="(\d+)"', line)
                assert status is not None, line
                out[status.group(1)] = out.get(status.group(1), 0) + int(float(line.rsplit(" ", 1)[1]))
        return out

    await make.user("ana")
    token = {"Authorization": f"Bearer {await make.token('ana', 'repo:read')}"}
    async with AsyncTestClient(app) as client:
        before = counted((await client.get("/metrics")).text)
        monkeypatch.setattr(tokens, "resolve", busy)
        answers = [await client.get("/api/v1/user", headers=token) for _ in range(3)]
        monkeypatch.undo()
        after = counted((await client.get("/metrics")).text)
    assert [r.status_code for r in answers] == [503] * 3, answers[0].text
    assert answers[0].json()["code"] == "database_busy" and answers[0].headers["retry-after"] == "1"
    assert after.get("503", 0) - before.get("503", 0) == 3
    assert after.get("200", 0) == before.get("200", 0)
