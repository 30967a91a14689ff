"""Account settings over plain HTTP: changing one's password (current one required, audited,
rate-limited, other sessions signed out, this one kept), an admin's reset (page and REST), the
profile page `/{login}` and the routes it must not shadow, and error pages that keep the header."""

import re
from typing import Any

from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy import select

from forge.app.factory import create_app
from forge.core.settings import Settings
from forge.db.engine import Database
from forge.db.models import AuditEvent, WebSession
from tests.support.accounts import PASSWORD, Accounts
from tests.support.web import csrf_from, sign_in

NEW = "a much longer new password"


async def audit_rows(db: Database, action: str) -> list[AuditEvent]:
    async with db.session() as s:
        return list((await s.execute(select(AuditEvent).where(AuditEvent.action == action))).scalars())


async def session_count(db: Database) -> int:
    async with db.session() as s:
        return len((await s.execute(select(WebSession))).all())


async def change(client: AsyncTestClient[Any], current: str, new: str, repeat: str | None = None) -> Any:
    page = await client.get("/settings/password")
    form = {"current_password": current, "new_password": new, "repeat_password": new if repeat is None else repeat}
    return await client.post("/settings/password", data={**form, "csrf_token": csrf_from(page.text)})


def second_browser(settings: Settings) -> AsyncTestClient[Litestar]:
    """Another browser on the same instance: an app of its own (each test client runs its app on a
    loop of its own, and asyncpg connections belong to the loop that made them)."""
    return AsyncTestClient(app=create_app(settings), base_url="http://testserver.local")


async def test_change_password_keeps_this_session_and_ends_the_others(
    settings: Settings, client: AsyncTestClient[Any], make: Accounts, db: Database
) -> None:
    await make.user("ana")
    async with second_browser(settings) as other:
        await sign_in(other, "ana", PASSWORD)
        await sign_in(client, "ana", PASSWORD)
        assert await session_count(db) == 2
        r = await change(client, PASSWORD, NEW)
        assert r.status_code == 200 and "Password changed" in r.text
        assert (await client.get("/api/v1/user")).status_code == 200  # this session stays
        assert (await other.get("/api/v1/user")).status_code == 401  # the other one was signed out
    assert await session_count(db) == 1
    [row] = await audit_rows(db, "user.password.change")
    assert row.result == "ok" and row.target == "ana" and row.detail["other_sessions_ended"] == 1
    client.cookies.clear()
    assert (await sign_in(client, "ana", PASSWORD)).status_code == 401
    assert (await sign_in(client, "ana", NEW)).status_code == 303


async def test_refusals_show_the_form_again_with_the_reason(
    client: AsyncTestClient[Any], make: Accounts, db: Database
) -> None:
    await make.user("ana")
    await sign_in(client, "ana", PASSWORD)
    for current, new, repeat, status, says in (
        ("wrong password!", NEW, None, 403, "current password is wrong"),
        (PASSWORD, "short", None, 422, "at least 10 characters"),
        (PASSWORD, "x" * 1025, None, 422, "at most 1024"),
        (PASSWORD, NEW, NEW + "!", 422, "differ"),
    ):
        r = await change(client, current, new, repeat)
        assert r.status_code == status, (new, r.text)
        assert 'id="password-error"' in r.text and says in r.text
        assert 'id="password-form"' in r.text
    [wrong] = await audit_rows(db, "user.password.change")
    assert wrong.result == "refused" and wrong.detail["reason"] == "wrong_password"
    assert (await client.get("/api/v1/user")).status_code == 200


async def test_wrong_current_passwords_are_rate_limited(
    client: AsyncTestClient[Any], make: Accounts, settings: Settings
) -> None:
    await make.user("ana")
    await sign_in(client, "ana", PASSWORD)
    for _ in range(settings.signin_max_failures):
        assert (await change(client, "not my password", NEW)).status_code == 403
    r = await change(client, PASSWORD, NEW)  # even the right one, until the window passes
    assert r.status_code == 429 and "Retry-After" in r.headers


async def test_admin_resets_a_password_in_the_ui(
    settings: Settings, client: AsyncTestClient[Any], make: Accounts, db: Database
) -> None:
    await make.user("root", admin=True)
    await make.user("ana")
    async with second_browser(settings) as ana:
        await sign_in(ana, "ana", PASSWORD)
        await sign_in(client, "root", PASSWORD)
        csrf = csrf_from((await client.get("/admin/")).text)
        r = await client.post("/admin/accounts/ana/password", data={"password": "", "csrf_token": csrf})
        assert r.status_code == 200
        generated = re.search(r'id="new-password">([^<]+)<', r.text)
        assert generated, r.text
        assert (await ana.get("/api/v1/user")).status_code == 401  # signed out everywhere
        r = await client.post("/admin/accounts/ana/password", data={"password": "short", "csrf_token": csrf})
        assert r.status_code == 422 and "at least 10" in r.text
        ana.cookies.clear()
        assert (await sign_in(ana, "ana", generated.group(1))).status_code == 303
    [row] = await audit_rows(db, "user.password.reset")
    assert row.target == "ana" and row.detail["sessions_ended"] == 1


async def test_admin_api_sets_passwords(client: AsyncTestClient[Any], make: Accounts, db: Database) -> None:
    await make.user("root", admin=True)
    await make.user("ana")
    await make.bot("fixer")
    h = {"Authorization": f"Bearer {await make.token('root', 'admin')}"}
    r = await client.put("/api/v1/admin/accounts/ana/password", json={"password": NEW}, headers=h)
    assert r.status_code == 200 and r.json() == {"login": "ana", "password": None, "sessions_ended": 0}
    r = await client.put("/api/v1/admin/accounts/ana/password", json={}, headers=h)
    generated = r.json()["password"]
    assert r.status_code == 200 and len(generated) >= 10
    assert (await sign_in(client, "ana", generated)).status_code == 303
    for login, body, status, code in (
        ("ana", {"password": "short"}, 422, "weak_password"),
        ("ana", {"password": "x" * 1025}, 422, "invalid_password"),
        ("ana", {"password": "x" * 5000}, 422, "validation_failed"),
        ("fixer", {"password": NEW}, 422, "no_password"),
        ("nobody", {"password": NEW}, 404, "account_not_found"),
    ):
        r = await client.put(f"/api/v1/admin/accounts/{login}/password", json=body, headers=h)
        assert (r.status_code, r.json()["code"]) == (status, code), (login, r.text)
    ana = {"Authorization": f"Bearer {await make.token('ana', 'repo:read')}"}
    r = await client.put("/api/v1/admin/accounts/root/password", json={"password": NEW}, headers=ana)
    assert r.status_code == 403
    assert [row.target for row in await audit_rows(db, "user.password.reset")] == ["ana", "ana"]


async def test_profile_shows_what_the_viewer_may_see(client: AsyncTestClient[Any], make: Accounts) -> None:
    await make.user("ana")
    await make.user("bob")
    ana = {"Authorization": f"Bearer {await make.token('ana', 'repo:write')}"}
    for name, visibility in (("open", "public"), ("hidden", "private")):
        body = {"name": name, "visibility": visibility}
        assert (await client.post("/api/v1/user/repos", json=body, headers=ana)).status_code == 201
    await sign_in(client, "bob", PASSWORD)
    r = await client.get("/ana")
    assert r.status_code == 200
    assert "ana/open" in r.text and "ana/hidden" not in r.text
    assert "Your tasks" not in r.text  # not bob's own profile
    client.cookies.clear()
    await sign_in(client, "ana", PASSWORD)
    r = await client.get("/ANA")  # logins are case-insensitive
    assert "ana/open" in r.text and "ana/hidden" in r.text and "Your tasks" in r.text
    r = await client.get("/nobody", headers={"Accept": "text/html"})
    assert r.status_code == 404 and "account_not_found" in r.text


async def test_the_profile_route_shadows_no_other_route(app: Litestar, client: AsyncTestClient[Any]) -> None:
    from forge.accounts.accounts import RESERVED_LOGINS

    first_segments = {
        route.path.split("/")[1] for route in app.routes if route.path.count("/") >= 1 and route.path != "/"
    }
    static = {s for s in first_segments if s and not s.startswith("{")}
    assert static <= RESERVED_LOGINS, static - RESERVED_LOGINS  # no account can be named like a route
    for path in ("/repos", "/tasks", "/signin", "/healthz"):
        r = await client.get(path, follow_redirects=False)
        assert r.status_code in (200, 303, 401), (path, r.status_code)  # the route itself answered
        assert 'class="profile-head"' not in r.text


async def test_error_pages_keep_the_signed_in_header(client: AsyncTestClient[Any], make: Accounts) -> None:
    await make.user("ana")
    await sign_in(client, "ana", PASSWORD)
    html = {"Accept": "text/html"}
    for path, status in (("/ana/nothing", 404), ("/a/b/c/d/e/f/g/h", 404), ("/admin/", 403)):
        r = await client.get(path, headers=html)
        assert r.status_code == status, path
        assert "Sign out" in r.text and ">ana<" in r.text, path
        assert 'href="/settings"' in r.text


async def test_a_profile_tells_strangers_nothing_of_admin_status(client: AsyncTestClient[Any], make: Accounts) -> None:
    await make.user("root", admin=True)
    await make.user("bob")
    for who in (None, "bob"):
        client.cookies.clear()
        if who:
            await sign_in(client, who, PASSWORD)
        r = await client.get("/root", headers={"Accept": "text/html"})
        assert r.status_code == 200 and "instance admin" not in r.text
    client.cookies.clear()
    await sign_in(client, "root", PASSWORD)
    assert "instance admin" in (await client.get("/root")).text  # the account itself sees it


async def test_settings_are_one_place_with_a_side_nav(client: AsyncTestClient[Any], make: Accounts) -> None:
    await make.user("ana")
    r = await client.get("/settings", headers={"Accept": "text/html"}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/signin?next=%2Fsettings"
    await sign_in(client, "ana", PASSWORD)
    r = await client.get("/settings", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/settings/profile"
    sections = {
        "/settings/profile": "Profile",
        "/settings/password": "Password",
        "/settings/tokens/": "Tokens",
        "/settings/model-keys/": "Model access",
    }
    for path in sections:
        r = await client.get(path)
        assert r.status_code == 200, path
        nav = r.text[r.text.index('<nav aria-label="Settings"') :]
        nav = nav[: nav.index("</nav>")]
        for other, other_label in sections.items():
            current = ' aria-current="page"' if other == path else ""
            assert f'<a href="{other}"{current}>{other_label}</a>' in nav, (path, other)
    home = await client.get("/")
    assert '<a href="/settings">Settings</a>' in home.text
    assert 'href="/settings/account/"' not in home.text and ">Tokens</a></li>" not in home.text


async def test_the_old_account_address_still_works(client: AsyncTestClient[Any], make: Accounts) -> None:
    await make.user("ana")
    await sign_in(client, "ana", PASSWORD)
    r = await client.get("/settings/account/", follow_redirects=False)
    assert r.status_code == 301 and r.headers["location"] == "/settings/password"
    # A password form open in an old tab still changes the password (a 308 keeps method and body).
    csrf = csrf_from((await client.get("/settings/password")).text)
    form = {"current_password": PASSWORD, "new_password": NEW, "repeat_password": NEW, "csrf_token": csrf}
    r = await client.post("/settings/account/password", data=form, follow_redirects=False)
    assert r.status_code == 308 and r.headers["location"] == "/settings/password"
    r = await client.post("/settings/account/password", data=form)
    assert r.status_code == 200 and "Password changed" in r.text


async def test_the_profile_section_changes_the_display_name(
    client: AsyncTestClient[Any], make: Accounts, db: Database
) -> None:
    await make.user("ana")
    await sign_in(client, "ana", PASSWORD)
    csrf = csrf_from((await client.get("/settings/profile")).text)
    r = await client.post("/settings/profile", data={"display_name": "  Ana Lima ", "csrf_token": csrf})
    assert r.status_code == 200 and "Profile saved." in r.text and 'value="Ana Lima"' in r.text
    assert "(Ana Lima)" in (await client.get("/ana")).text
    r = await client.post("/settings/profile", data={"display_name": "x" * 201, "csrf_token": csrf})
    assert r.status_code == 422 and 'id="profile-error"' in r.text and "at most 200" in r.text
    assert 'value="' + "x" * 200 in r.text  # what was typed comes back (cut to what fits)
    [row] = await audit_rows(db, "user.profile.update")
    assert row.target == "ana" and row.result == "ok"
