"""Attacks found in review, each shown to fail."""

import asyncio
from typing import Any

import httpx
from litestar.testing import AsyncTestClient

from tests.support.accounts import PASSWORD, Accounts, LiveServer, make_account_with_token, run_sync
from tests.support.web import csrf_from, sign_in


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def test_admins_narrow_token_is_not_admin_of_other_repos(client: AsyncTestClient[Any], make: Accounts) -> None:
    await make.user("root", admin=True)
    await make.user("alice")
    alice = bearer(await make.token("alice", "repo:write"))
    await client.post("/api/v1/user/repos", json={"name": "secret", "auto_init": True}, headers=alice)
    narrow = bearer(await make.token("root", "repo:write"))
    r = await client.put("/api/v1/repos/alice/secret/collaborators/root", json={"role": "admin"}, headers=narrow)
    assert r.status_code == 404
    r = await client.request("DELETE", "/api/v1/repos/alice/secret", json={"confirm": "alice/secret"}, headers=narrow)
    assert r.status_code == 404
    full = bearer(await make.token("root", "admin"))
    assert (await client.get("/api/v1/repos/alice/secret", headers=full)).status_code == 200


async def test_refused_settings_change_changes_nothing(client: AsyncTestClient[Any], make: Accounts) -> None:
    await make.user("alice")
    await sign_in(client, "alice", PASSWORD)
    form = await client.get("/repos/new")
    await client.post("/repos/new", data={"name": "r", "auto_init": "1", "csrf_token": csrf_from(form.text)})
    page = await client.get("/alice/r/settings/")
    r = await client.post(
        "/alice/r/settings/",
        data={"visibility": "public", "default_branch": "nope", "description": "x", "csrf_token": csrf_from(page.text)},
    )
    assert r.status_code == 422
    client.cookies.clear()
    assert (await client.get("/api/v1/repos/alice/r")).status_code == 404  # still private


async def test_parallel_wrong_passwords_are_rate_limited(client: AsyncTestClient[Any], make: Accounts) -> None:
    await make.user("alice")
    page = await client.get("/signin")
    csrf = csrf_from(page.text)

    async def attempt() -> int:
        r = await client.post("/signin", data={"login": "alice", "password": "wrong password", "csrf_token": csrf})
        return r.status_code

    codes = await asyncio.gather(*(attempt() for _ in range(15)))
    assert codes.count(401) <= 5, codes
    assert codes.count(429) >= 10, codes


async def test_signed_in_user_can_sign_in_as_someone_else(client: AsyncTestClient[Any], make: Accounts) -> None:
    await make.user("alice")
    await make.user("bob")
    await sign_in(client, "alice", PASSWORD)
    r = await sign_in(client, "bob", PASSWORD)
    assert r.status_code == 303
    assert (await client.get("/api/v1/user")).json()["login"] == "bob"


async def test_crafted_inputs_get_4xx(client: AsyncTestClient[Any], make: Accounts) -> None:
    r = await client.get("/api/v1/user", headers={"Authorization": b"Basic \xf1\xf1\xf1"})
    assert r.status_code == 401
    await make.user("alice")
    await sign_in(client, "alice", PASSWORD)
    page = await client.get("/settings/tokens/")
    r = await client.post(
        "/settings/tokens/",
        data={"name": "x", "scopes": "repo:read", "expires_days": "²", "csrf_token": csrf_from(page.text)},
    )
    assert r.status_code == 422


def test_huge_markdown_readme_does_not_stall_the_server(live_server: LiveServer) -> None:
    token = run_sync(make_account_with_token(live_server.settings, "alice", "repo:write"))
    headers = bearer(token)
    r = httpx.post(
        f"{live_server.url}/api/v1/user/repos", json={"name": "big", "visibility": "public"}, headers=headers
    )
    assert r.status_code == 201
    from forge.git import Identity, RepoStore
    from forge.git.bare import write_commit

    async def put_readme() -> None:
        store = RepoStore(live_server.settings.data_dir / "repos")
        try:
            await store.write(
                ("alice", "big"), write_commit, branch="main", files={"README.md": "- item\n" * 140_000},
                message="big", author=Identity(name="a", email="a@x"),
            )  # fmt: skip
        finally:
            await store.close()

    run_sync(put_readme())
    home = httpx.get(f"{live_server.url}/alice/big", timeout=60)
    assert home.status_code == 200 and "<pre>" in home.text  # shown as text, not rendered
