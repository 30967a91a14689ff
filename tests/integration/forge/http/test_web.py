"""The web shell over plain HTTP: sign-in/out, sessions, CSRF, sign-in rate limit, tokens and admin pages."""

import re
from typing import Any

from litestar.testing import AsyncTestClient
from sqlalchemy import select

from forge.db.engine import Database
from forge.db.models import AuditEvent, WebSession
from tests.support.accounts import PASSWORD, Accounts
from tests.support.web import csrf_from, sign_in


async def actions(db: Database) -> list[tuple[str, str, str]]:
    async with db.session() as s:
        rows = (await s.execute(select(AuditEvent).order_by(AuditEvent.id))).scalars()
        return [(r.action, r.target, r.result) for r in rows]


async def test_sign_in_sets_session_and_sign_out_ends_it(
    client: AsyncTestClient[Any], make: Accounts, db: Database
) -> None:
    await make.user("ana")
    assert (await client.get("/", follow_redirects=False)).headers["location"] == "/signin"
    r = await sign_in(client, "ana", PASSWORD)
    assert r.status_code == 303
    cookie = r.headers["set-cookie"]
    assert "fh_session=" in cookie and "HttpOnly" in cookie and "SameSite=lax" in cookie
    assert "Secure" not in cookie  # served over http in this test
    home = await client.get("/")
    assert home.status_code == 200 and "Welcome, ana" in home.text
    me = await client.get("/api/v1/user")
    assert me.json()["login"] == "ana" and me.json()["token_scopes"] is None

    r = await client.post("/signout", data={"csrf_token": csrf_from(home.text)}, follow_redirects=False)
    assert r.status_code == 303
    async with db.session() as s:
        assert (await s.execute(select(WebSession))).first() is None
    assert (await client.get("/api/v1/user")).status_code == 401
    assert ("auth.sign_in", "ana", "ok") in await actions(db)
    assert ("auth.sign_out", "ana", "ok") in await actions(db)


async def test_secure_cookie_when_served_over_https(tmp_path: Any, db_url: str, make: Accounts) -> None:
    from forge.app.factory import create_app
    from forge.core.settings import load_settings, prepare_data_dir

    settings = prepare_data_dir(
        load_settings(environ={}, data_dir=tmp_path / "d2", database_url=db_url, base_url="https://forge.example")
    )
    await make.user("ana")
    async with AsyncTestClient(app=create_app(settings), base_url="https://forge.example") as c:
        r = await sign_in(c, "ana", PASSWORD)
    assert r.status_code == 303
    assert "Secure" in r.headers["set-cookie"]


async def test_wrong_password_unknown_user_disabled_account(
    client: AsyncTestClient[Any], make: Accounts, db: Database
) -> None:
    await make.user("ana")
    r = await sign_in(client, "ana", "wrong password!")
    assert r.status_code == 401 and "wrong login or password" in r.text
    r = await sign_in(client, "nobody", PASSWORD)
    assert r.status_code == 401 and "wrong login or password" in r.text
    await make.user("root", admin=True)
    token = await make.token("root", "admin")
    await client.patch(
        "/api/v1/admin/accounts/ana", json={"disabled": True}, headers={"Authorization": f"Bearer {token}"}
    )
    r = await sign_in(client, "ana", PASSWORD)
    assert r.status_code == 401 and "disabled" in r.text
    refused = [a for a in await actions(db) if a[0] == "auth.sign_in" and a[2] == "refused"]
    assert [t for _, t, _ in refused] == ["ana", "nobody", "ana"]


async def test_bots_cannot_sign_in(client: AsyncTestClient[Any], make: Accounts) -> None:
    await make.bot("fixer")
    r = await sign_in(client, "fixer", "")
    assert r.status_code in (401, 422, 400)
    assert "fh_session" not in r.headers.get("set-cookie", "")


async def test_sign_in_is_rate_limited_per_login(client: AsyncTestClient[Any], make: Accounts, db: Database) -> None:
    await make.user("ana")
    for _ in range(5):
        assert (await sign_in(client, "ana", "not the password")).status_code == 401
    # Even the right password is refused while limited: brute force learns nothing.
    r = await sign_in(client, "ana", PASSWORD)
    assert r.status_code == 429
    assert int(r.headers["retry-after"]) > 0
    assert ("auth.sign_in.limited", "ana", "refused") in await actions(db)
    # Another login from the same address is still allowed (per-address limit is higher).
    await make.user("bob")
    assert (await sign_in(client, "bob", PASSWORD)).status_code == 303


async def test_sign_in_without_csrf_is_refused(client: AsyncTestClient[Any], make: Accounts, db: Database) -> None:
    await make.user("ana")
    await client.get("/signin")  # sets the pre-session cookie
    r = await client.post("/signin", data={"login": "ana", "password": PASSWORD, "csrf_token": "forged"})
    assert r.status_code == 403
    assert "fh_session" not in r.headers.get("set-cookie", "")
    assert ("auth.csrf", "/signin", "refused") in await actions(db)


async def test_session_forms_need_the_session_csrf_token(
    client: AsyncTestClient[Any], make: Accounts, db: Database
) -> None:
    await make.user("ana")
    await sign_in(client, "ana", PASSWORD)
    # A cross-site form post carries the cookie but not the token.
    r = await client.post("/settings/tokens/", data={"name": "x", "scopes": "repo:read"})
    assert r.status_code == 403
    r = await client.post("/settings/tokens/", data={"name": "x", "scopes": "repo:read", "csrf_token": "nope"})
    assert r.status_code == 403
    # A cookie-authenticated JSON call is a CSRF target too.
    r = await client.post("/api/v1/user/tokens", json={"name": "x", "scopes": ["repo:read"]})
    assert r.status_code == 403 and r.json()["code"] == "csrf_failed"
    page = await client.get("/settings/tokens/")
    r = await client.post(
        "/api/v1/user/tokens",
        json={"name": "x", "scopes": ["repo:read"]},
        headers={"X-CSRF-Token": csrf_from(page.text)},
    )
    assert r.status_code == 201
    assert len([a for a in await actions(db) if a[0] == "auth.csrf"]) == 3


async def test_tokens_page_create_shows_once_then_revoke(client: AsyncTestClient[Any], make: Accounts) -> None:
    await make.user("ana")
    await sign_in(client, "ana", PASSWORD)
    page = await client.get("/settings/tokens/")
    assert "admin" not in re.findall(r'name="scopes" value="([^"]+)"', page.text)
    r = await client.post(
        "/settings/tokens/",
        data={
            "name": "laptop",
            "scopes": ["repo:read", "repo:write"],
            "expires_days": "30",
            "csrf_token": csrf_from(page.text),
        },
    )
    assert r.status_code == 200
    token = re.search(r'id="new-token">(fh_\w+)<', r.text)
    assert token, r.text
    secret = token.group(1)
    listing = await client.get("/settings/tokens/")
    assert secret not in listing.text and secret[-8:] in listing.text
    api = await client.get("/api/v1/user", headers={"Authorization": f"Bearer {secret}"})
    assert api.json()["token_scopes"] == ["repo:read", "repo:write"]

    token_id = re.search(r"/settings/tokens/(\d+)/revoke", listing.text)
    assert token_id
    r = await client.post(
        f"/settings/tokens/{token_id.group(1)}/revoke",
        data={"csrf_token": csrf_from(listing.text)},
        follow_redirects=False,
    )
    assert r.status_code == 303
    assert (await client.get("/api/v1/user", headers={"Authorization": f"Bearer {secret}"})).status_code == 401


async def test_tokens_page_rejects_bad_input_without_500(client: AsyncTestClient[Any], make: Accounts) -> None:
    await make.user("ana")
    await sign_in(client, "ana", PASSWORD)
    csrf = csrf_from((await client.get("/settings/tokens/")).text)
    for data in (
        {"name": "", "scopes": "repo:read"},
        {"name": "x", "scopes": "root:everything"},
        {"name": "x", "scopes": "admin"},  # ana is not an admin
        {"name": "x"},
        {"name": "x", "scopes": "repo:read", "expires_days": "soon"},
    ):
        r = await client.post("/settings/tokens/", data={**data, "csrf_token": csrf})
        assert r.status_code == 422, data
        assert 'class="error"' in r.text, data


async def test_admin_pages_for_admins_only(client: AsyncTestClient[Any], make: Accounts, db: Database) -> None:
    await make.user("ana")
    assert (await client.get("/admin/", follow_redirects=False)).status_code in (303, 401)
    await sign_in(client, "ana", PASSWORD)
    r = await client.get("/admin/", headers={"Accept": "text/html"})
    assert r.status_code == 403 and "Forbidden" in r.text
    assert ("access.denied", "/admin", "refused") in await actions(db)


async def test_admin_creates_user_and_bot_with_token(client: AsyncTestClient[Any], make: Accounts) -> None:
    await make.user("root", admin=True)
    await sign_in(client, "root", PASSWORD)
    page = await client.get("/admin/")
    csrf = csrf_from(page.text)
    r = await client.post("/admin/accounts", data={"login": "carol", "kind": "user", "csrf_token": csrf})
    password = re.search(r'id="new-password">([^<]+)<', r.text)
    assert password, r.text
    r = await client.post(
        "/admin/accounts", data={"login": "helper", "kind": "bot", "owner": "root", "csrf_token": csrf}
    )
    assert "bot helper created" in r.text
    r = await client.post(
        "/admin/accounts/helper/tokens", data={"name": "ci", "scopes": "tasks:write", "csrf_token": csrf}
    )
    secret = re.search(r'id="new-token">(fh_\w+)<', r.text)
    assert secret
    me = await client.get("/api/v1/user", headers={"Authorization": f"Bearer {secret.group(1)}"})
    assert me.json()["login"] == "helper" and me.json()["type"] == "Bot"
    audit_page = await client.get("/admin/audit")
    assert "user.create" in audit_page.text and "bot.create" in audit_page.text and "token.create" in audit_page.text
    # The new person can sign in with the password shown once.
    client.cookies.clear()
    assert (await sign_in(client, "carol", password.group(1))).status_code == 303


async def test_open_redirect_is_refused(client: AsyncTestClient[Any], make: Accounts) -> None:
    await make.user("ana")
    page = await client.get("/signin?next=//evil.example/")
    r = await client.post(
        "/signin",
        data={"login": "ana", "password": PASSWORD, "csrf_token": csrf_from(page.text), "next": "//evil.example/"},
        follow_redirects=False,
    )
    assert r.headers["location"] == "/"


async def test_static_htmx_is_vendored(client: AsyncTestClient[Any]) -> None:
    r = await client.get("/static/vendor/htmx-2.0.11.min.js")
    assert r.status_code == 200 and "htmx" in r.text
