"""Bad input never gets a 500: problem details with a stable code, and audit rows for refusals."""

from typing import Any

import msgspec
from litestar.handlers import HTTPRouteHandler
from litestar.testing import AsyncTestClient
from sqlalchemy import select

from forge.db.engine import Database
from forge.db.models import AccessToken, AuditEvent
from tests.support.accounts import Accounts


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def test_token_api_create_list_revoke_needs_a_session(client: AsyncTestClient[Any], make: Accounts) -> None:
    await make.user("ana")
    token = await make.token("ana", "repo:write")
    # A token cannot mint more tokens.
    r = await client.post("/api/v1/user/tokens", json={"name": "x", "scopes": ["repo:read"]}, headers=bearer(token))
    assert r.status_code == 403 and r.json()["code"] == "forbidden"
    listing = await client.get("/api/v1/user/tokens", headers=bearer(token))
    assert listing.status_code == 200
    [only] = listing.json()
    assert only["last_eight"] == token[-8:] and "token" not in only and only["scopes"] == ["repo:write"]


async def test_malformed_json_and_unknown_fields(client: AsyncTestClient[Any], make: Accounts) -> None:
    await make.user("root", admin=True)
    admin = bearer(await make.token("root", "admin"))
    r = await client.post(
        "/api/v1/admin/bots", content=b'{"login": "x",', headers={**admin, "Content-Type": "application/json"}
    )
    assert r.status_code == 400 and r.json()["code"] == "malformed_body"
    for body in (b'{"login": "\xff\xfe"}', b"\xc3\x28"):  # not UTF-8
        r = await client.post("/api/v1/admin/bots", content=body, headers={**admin, "Content-Type": "application/json"})
        assert r.status_code in (400, 422) and r.json()["code"] in ("invalid_encoding", "malformed_body"), r.text
    r = await client.post("/api/v1/admin/bots", json={"login": "x", "colour": "red"}, headers=admin)
    assert r.status_code == 422 and r.json()["code"] == "validation_failed"
    r = await client.post("/api/v1/admin/bots", json={"login": 5}, headers=admin)
    assert r.status_code == 422
    r = await client.post("/api/v1/admin/bots", json={"login": "-bad-"}, headers=admin)
    assert r.status_code == 422 and r.json()["code"] == "invalid_login"
    r = await client.post("/api/v1/admin/bots", json={"login": "api"}, headers=admin)
    assert r.status_code == 422 and r.json()["code"] == "invalid_login"
    r = await client.post("/api/v1/admin/users", json={"login": "carol", "password": "short"}, headers=admin)
    assert r.status_code == 422 and r.json()["code"] == "weak_password"
    assert (await client.post("/api/v1/admin/bots", json={"login": "fixer"}, headers=admin)).status_code == 201
    r = await client.post("/api/v1/admin/bots", json={"login": "FIXER"}, headers=admin)
    assert r.status_code == 409 and r.json()["code"] == "login_taken"
    for r in [
        await client.post(
            "/api/v1/admin/accounts/nobody/tokens", json={"name": "t", "scopes": ["repo:read"]}, headers=admin
        ),
        await client.patch("/api/v1/admin/accounts/nobody", json={"disabled": True}, headers=admin),
    ]:
        assert r.status_code == 404 and r.json()["code"] == "account_not_found"
    r = await client.post("/api/v1/admin/accounts/fixer/tokens", json={"name": "t", "scopes": ["admin"]}, headers=admin)
    assert r.status_code == 422 and r.json()["code"] == "invalid_scope"
    r = await client.post(
        "/api/v1/admin/accounts/fixer/tokens",
        json={"name": "t", "scopes": ["repo:read"], "expires_days": 0},
        headers=admin,
    )
    assert r.status_code == 422


async def test_oversized_body_is_413(client: AsyncTestClient[Any], make: Accounts) -> None:
    await make.user("root", admin=True)
    admin = bearer(await make.token("root", "admin"))
    big = b'{"login": "' + b"a" * (2 * 1024 * 1024) + b'"}'
    r = await client.post("/api/v1/admin/bots", content=big, headers={**admin, "Content-Type": "application/json"})
    assert r.status_code == 413
    assert r.json()["code"] == "payload_too_large"


async def test_scope_and_admin_refusals_are_audited(client: AsyncTestClient[Any], make: Accounts, db: Database) -> None:
    await make.user("ana")
    await make.user("root", admin=True)
    weak = await make.token("ana", "repo:read")
    no_admin_scope = await make.token("root", "repo:write")
    r = await client.get("/api/v1/admin/accounts", headers=bearer(weak))
    assert r.status_code == 403
    r = await client.get("/api/v1/admin/accounts", headers=bearer(no_admin_scope))
    assert r.status_code == 403
    async with db.session() as s:
        rows = list((await s.execute(select(AuditEvent).where(AuditEvent.action == "access.denied"))).scalars())
    assert [(r.actor_login, r.target, r.result) for r in rows] == [
        ("ana", "/api/v1/admin/accounts", "refused"),
        ("root", "/api/v1/admin/accounts", "refused"),
    ]
    assert all(r.token_id is not None and r.client_addr for r in rows)


async def test_admin_api_creates_bot_token_and_revokes_others_tokens(
    client: AsyncTestClient[Any], make: Accounts, db: Database
) -> None:
    await make.user("root", admin=True)
    await make.user("ana")
    admin = bearer(await make.token("root", "admin"))
    assert (await client.post("/api/v1/admin/bots", json={"login": "fixer", "owner": "ana"}, headers=admin)).json()[
        "owner"
    ] == "ana"
    r = await client.post(
        "/api/v1/admin/accounts/fixer/tokens",
        json={"name": "ci", "scopes": ["tasks:write"], "expires_days": 7},
        headers=admin,
    )
    assert r.status_code == 201
    created = r.json()
    assert created["token"].startswith("fh_") and created["info"]["expires_at"]
    bot_token = created["token"]
    assert (await client.get("/api/v1/user", headers=bearer(bot_token))).json()["login"] == "fixer"
    # Admins may revoke anyone's token.
    r = await client.delete(f"/api/v1/user/tokens/{created['info']['id']}", headers=admin)
    assert r.status_code == 200 and r.json()["revoked"] is True
    assert (await client.get("/api/v1/user", headers=bearer(bot_token))).status_code == 401
    # Someone else's token id is a 404 for a non-admin.
    ana_token = await make.token("ana", "repo:read")
    async with db.session() as s:
        ana_id = (await s.execute(select(AccessToken.id).where(AccessToken.last_eight == ana_token[-8:]))).scalar_one()
    await make.user("bob")
    bob = bearer(await make.token("bob", "repo:read"))
    assert (await client.delete(f"/api/v1/user/tokens/{ana_id}", headers=bob)).status_code == 404
    assert (await client.get("/api/v1/admin/audit?limit=5", headers=admin)).json()[0]["action"]


async def test_unknown_routes_and_methods_are_problems(client: AsyncTestClient[Any]) -> None:
    r = await client.get("/api/v1/nope")
    assert r.status_code == 404 and r.json()["code"] == "not_found"
    r = await client.put("/api/v1/user")
    assert r.status_code in (401, 405)
    r = await client.delete("/api/v1/user/tokens/abc")
    assert r.status_code in (401, 404)


async def test_health_metrics_schema(client: AsyncTestClient[Any]) -> None:
    r = await client.get("/healthz")
    assert r.status_code == 200 and r.json()["status"] == "ok"
    await client.get("/api/v1/user")
    metrics = await client.get("/metrics")
    assert metrics.status_code == 200 and "forgehand_requests_total" in metrics.text
    schema = await client.get("/api/schema/openapi.json")
    assert schema.status_code == 200
    paths = schema.json()["paths"]
    assert "/api/v1/user" in paths and "/api/v1/user/tokens" in paths
    assert not any(p.startswith("/signin") for p in paths)


async def test_nul_characters_are_refused_not_500(client: AsyncTestClient[Any], make: Accounts) -> None:
    """PostgreSQL cannot store NUL: every input path refuses it with a 4xx on both backends."""
    from tests.support.web import csrf_from

    await make.user("ana")
    token = bearer(await make.token("ana", "repo:write"))
    for r in [
        await client.get("/api/v1/repos?owner=a%00b", headers=token),
        await client.get("/api/v1/repos/an%00a/x", headers=token),
        await client.post("/api/v1/user/repos", json={"name": "ok", "description": "a\x00b"}, headers=token),
    ]:
        assert 400 <= r.status_code < 500, r.text
        assert r.json()["code"] in {"invalid_characters", "validation_failed", "not_found", "repo_not_found"}
    page = await client.get("/signin")
    r = await client.post(
        "/signin", data={"login": "an\x00a", "password": "x", "csrf_token": csrf_from(page.text), "next": "/"}
    )
    assert r.status_code == 401


async def test_no_body_field_shares_a_name_with_a_dependency(client: AsyncTestClient[Any]) -> None:
    """Litestar reads a validation error on a body field named like one of the handler's dependencies
    as a server error (500, not 422): no request body may have such a field."""
    clashes = []
    for route in client.app.routes:
        for handler in getattr(route, "route_handlers", []):
            if not isinstance(handler, HTTPRouteHandler) or "data" not in handler.parsed_fn_signature.parameters:
                continue
            body = handler.parsed_fn_signature.parameters["data"].annotation
            if not (isinstance(body, type) and issubclass(body, msgspec.Struct)):
                continue
            fields = {f.encode_name for f in msgspec.structs.fields(body)}
            clashes += [(route.path, f) for f in fields & set(handler.resolve_dependencies())]
    assert not clashes
