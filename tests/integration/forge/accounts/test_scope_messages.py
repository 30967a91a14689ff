"""A token that lacks a scope is told which one (docs/api.md): `403 insufficient_scope` with the
scope's name in `detail`, for a REST endpoint of every scope family; and refusals that are not
about scopes say what they are about (a token managing tokens, a non-admin)."""

from typing import Any

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient

from forge.accounts import accounts, tokens
from forge.core.settings import Settings
from forge.db.engine import Database
from tests.support.accounts import Accounts
from tests.support.task_world import SYSTEM, TASKS, World, build_task_world

REPO = "/api/v1/repos/ana/demo"
HOOK = {"url": "http://127.0.0.1:9/hook", "kind": "notify", "events": ["task.created"]}
TASK = {"goal": "shout", "agent": "fixer", "command": "true", "title": "Shout"}

# scope family -> (the token's scopes, without it; method, path, body)
CASES: dict[str, tuple[list[str], str, str, dict[str, Any] | None]] = {
    "repo:read": (["tasks:read"], "GET", f"{REPO}/branches", None),
    "repo:write": (["repo:read"], "PATCH", REPO, {"description": "x"}),
    "tasks:read": (["repo:read"], "GET", TASKS, None),
    "tasks:write": (["tasks:read", "repo:read"], "POST", TASKS, TASK),
    "reviews:write": (["tasks:write", "repo:write"], "POST", f"{TASKS}/1/reviews", {"verdict": "comment", "body": "x"}),
    "webhooks:admin": (["repo:write"], "POST", f"{REPO}/hooks", HOOK),
}


@pytest.fixture
async def world(db: Database, settings: Settings, client: AsyncTestClient[Litestar]) -> World:
    w = await build_task_world(db, settings)
    async with db.session(write=True) as s:
        ana = await accounts.require_by_login(s, "ana")
        for family, (scopes, *_rest) in CASES.items():
            w.tokens[family] = (await tokens.create(s, SYSTEM, ana, family, scopes, None)).token
    assert (await client.post(TASKS, json=TASK, headers=w.h("ana"))).status_code == 201  # task 1
    return w


@pytest.mark.parametrize("family", sorted(CASES))
async def test_a_missing_scope_is_named(client: AsyncTestClient[Litestar], world: World, family: str) -> None:
    _scopes, method, path, body = CASES[family]
    r = await client.request(method, path, json=body, headers=world.h(family))
    assert r.status_code == 403, r.text
    problem = r.json()
    assert problem["code"] == "insufficient_scope"
    assert f"'{family}'" in problem["detail"]


async def test_an_admins_narrow_token_is_told_it_lacks_admin(client: AsyncTestClient[Any], make: Accounts) -> None:
    await make.user("root", admin=True)
    narrow = await make.token("root", "repo:read")
    for method, path, body in (
        ("GET", "/api/v1/admin/accounts", None),
        ("GET", "/api/v1/admin/audit", None),
        ("PUT", "/api/v1/admin/accounts/root/password", {"password": "another long password"}),
    ):
        r = await client.request(method, path, json=body, headers={"Authorization": f"Bearer {narrow}"})
        assert r.status_code == 403, (path, r.text)
        assert r.json()["code"] == "insufficient_scope"
        assert "'admin'" in r.json()["detail"]


async def test_other_refusals_say_what_they_are_about(client: AsyncTestClient[Any], make: Accounts) -> None:
    await make.user("ana")
    token = await make.token("ana", "repo:read")
    h = {"Authorization": f"Bearer {token}"}
    # Not an admin at all: no scope would help.
    r = await client.get("/api/v1/admin/accounts", headers=h)
    assert r.status_code == 403 and r.json()["code"] == "forbidden"
    assert "instance admin" in r.json()["detail"]
    # A token cannot mint or revoke tokens, its own included: told so, not "not found".
    r = await client.post("/api/v1/user/tokens", json={"name": "x", "scopes": ["repo:read"]}, headers=h)
    assert r.status_code == 403 and "browser session" in r.json()["detail"]
    [mine] = (await client.get("/api/v1/user/tokens", headers=h)).json()
    r = await client.delete(f"/api/v1/user/tokens/{mine['id']}", headers=h)
    assert r.status_code == 403 and "browser session" in r.json()["detail"]
    # Someone else's token stays hidden.
    await make.user("bob")
    await make.token("bob", "repo:read")
    bob = await make.token("bob", "repo:read")
    [bobs, *_] = (await client.get("/api/v1/user/tokens", headers={"Authorization": f"Bearer {bob}"})).json()
    assert (await client.delete(f"/api/v1/user/tokens/{bobs['id']}", headers=h)).status_code == 404
