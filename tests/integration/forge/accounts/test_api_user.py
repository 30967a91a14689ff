"""`GET /api/v1/user` and token authentication: Bearer, Basic, scopes, expiry, revocation."""

import base64
from datetime import timedelta
from typing import Any

import time_machine
from litestar.testing import AsyncTestClient
from sqlalchemy import select

from forge.db.engine import Database
from forge.db.models import AccessToken, AuditEvent
from tests.support.accounts import Accounts


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def audit_rows(db: Database, action: str) -> list[AuditEvent]:
    async with db.session() as s:
        return list((await s.execute(select(AuditEvent).where(AuditEvent.action == action))).scalars())


async def test_user_with_bearer_token(client: AsyncTestClient[Any], make: Accounts) -> None:
    await make.user("ana")
    token = await make.token("ana", "repo:read")
    r = await client.get("/api/v1/user", headers=bearer(token))
    assert r.status_code == 200
    body = r.json()
    assert body["login"] == "ana"
    assert body["type"] == "User"
    assert body["is_admin"] is False
    assert body["token_scopes"] == ["repo:read"]


async def test_bot_token_reports_bot_type(client: AsyncTestClient[Any], make: Accounts) -> None:
    await make.bot("fixer")
    token = await make.token("fixer", "tasks:write")
    r = await client.get("/api/v1/user", headers=bearer(token))
    assert r.status_code == 200
    assert r.json()["type"] == "Bot"
    # write implies read
    assert r.json()["token_scopes"] == ["tasks:read", "tasks:write"]


async def test_basic_auth_with_token_as_password(client: AsyncTestClient[Any], make: Accounts) -> None:
    await make.user("ana")
    token = await make.token("ana", "repo:read")
    creds = base64.b64encode(f"ana:{token}".encode()).decode()
    r = await client.get("/api/v1/user", headers={"Authorization": f"Basic {creds}"})
    assert r.status_code == 200
    assert r.json()["login"] == "ana"


async def test_basic_auth_refuses_account_password(client: AsyncTestClient[Any], make: Accounts, db: Database) -> None:
    await make.user("ana")
    creds = base64.b64encode(b"ana:correct horse battery").decode()
    r = await client.get("/api/v1/user", headers={"Authorization": f"Basic {creds}"})
    assert r.status_code == 401
    assert r.headers["content-type"].startswith("application/problem+json")
    assert r.json()["code"] == "invalid_token"
    assert len(await audit_rows(db, "auth.token")) == 1


async def test_anonymous_gets_401_problem(client: AsyncTestClient[Any]) -> None:
    r = await client.get("/api/v1/user")
    assert r.status_code == 401
    body = r.json()
    assert body["code"] == "unauthenticated"
    assert body["status"] == 401
    assert body["title"] and body["detail"]
    assert r.headers["www-authenticate"].startswith("Bearer")


async def test_malformed_unknown_revoked_expired_tokens(
    client: AsyncTestClient[Any], make: Accounts, db: Database
) -> None:
    await make.user("ana")
    cases = {
        "garbage": "invalid_token",
        "fh_" + "x" * 40: "invalid_token",  # well-formed but unknown
    }
    for token, code in cases.items():
        r = await client.get("/api/v1/user", headers=bearer(token))
        assert r.status_code == 401, token
        assert r.json()["code"] == code

    revoked = await make.token("ana", "repo:read")
    async with db.session(write=True) as s:
        row = (await s.execute(select(AccessToken).where(AccessToken.last_eight == revoked[-8:]))).scalar_one()
        token_id = row.id
    signed = await make.token("ana", "admin", "repo:read") if False else None
    assert signed is None
    # revoke through the API with a session is covered elsewhere; here through the service via the CLI path
    from forge.accounts import tokens
    from forge.db.audit import Actor

    async with db.session(write=True) as s:
        await tokens.revoke(s, Actor.system("test"), token_id)
    client.app.state.auth.token_cache.clear()
    r = await client.get("/api/v1/user", headers=bearer(revoked))
    assert r.status_code == 401
    assert r.json()["code"] == "token_revoked"

    expiring = await make.token("ana", "repo:read", expires_days=1)
    assert (await client.get("/api/v1/user", headers=bearer(expiring))).status_code == 200
    with time_machine.travel(timedelta(days=1, minutes=1), tick=False):
        r = await client.get("/api/v1/user", headers=bearer(expiring))
    assert r.status_code == 401
    assert r.json()["code"] == "token_expired"
    refused = await audit_rows(db, "auth.token")
    assert {row.detail["reason"] for row in refused} >= {"invalid_token", "token_revoked", "token_expired"}


async def test_disabled_account_token_stops_working(client: AsyncTestClient[Any], make: Accounts) -> None:
    await make.user("root", admin=True)
    await make.user("ana")
    admin_token = await make.token("root", "admin")
    token = await make.token("ana", "repo:read")
    assert (await client.get("/api/v1/user", headers=bearer(token))).status_code == 200
    r = await client.patch("/api/v1/admin/accounts/ana", json={"disabled": True}, headers=bearer(admin_token))
    assert r.status_code == 200
    assert r.json()["disabled"] is True
    r = await client.get("/api/v1/user", headers=bearer(token))
    assert r.status_code == 401
    assert r.json()["code"] == "account_disabled"


async def test_last_used_is_recorded(client: AsyncTestClient[Any], make: Accounts, db: Database) -> None:
    await make.user("ana")
    token = await make.token("ana", "repo:read")
    await client.get("/api/v1/user", headers=bearer(token))
    async with db.session() as s:
        row = (await s.execute(select(AccessToken))).scalar_one()
    assert row.last_used_at is not None
