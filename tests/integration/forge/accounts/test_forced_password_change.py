"""A generated password must be changed at first sign-in: the first admin's (bootstrap) and those
an admin generates. Until it is, pages redirect to the password page and the REST API refuses the
session; tokens keep working. The first admin's password file goes once root changes it."""

import re
from typing import Any

from litestar.testing import AsyncTestClient
from sqlalchemy import select

from forge.accounts import bootstrap, initial_password
from forge.core.settings import Settings
from forge.db.engine import Database
from forge.db.models import Account, AuditEvent
from tests.support.accounts import PASSWORD, Accounts
from tests.support.web import csrf_from, sign_in

NEW = "a password of my very own"
HTML = {"Accept": "text/html"}


async def flag(db: Database, login: str) -> bool:
    async with db.session() as s:
        account = (await s.execute(select(Account).where(Account.login_key == login))).scalar_one()
        return account.must_change_password


async def change(client: AsyncTestClient[Any], current: str, new: str, next_: str = "") -> Any:
    csrf = csrf_from((await client.get("/settings/password")).text)
    form = {"current_password": current, "new_password": new, "repeat_password": new, "next": next_}
    return await client.post("/settings/password", data={**form, "csrf_token": csrf})


async def test_root_changes_the_bootstrap_password_first_and_its_file_goes(
    settings: Settings, db: Database, client: AsyncTestClient[Any], make: Accounts
) -> None:
    password = await bootstrap.ensure_admin(db, settings)
    assert password is not None and await flag(db, "root")
    password_file = settings.data_dir / initial_password.PASSWORD_FILE
    assert f"password: {password}" in password_file.read_text()
    token = {"Authorization": f"Bearer {await make.token('root', 'admin')}"}

    assert (await sign_in(client, "root", password)).status_code == 303
    r = await client.get("/tasks?state=open", headers=HTML, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/settings/password?next=%2Ftasks%3Fstate%3Dopen"
    for path in ("/", "/admin/", "/settings/tokens/", "/root"):
        r = await client.get(path, headers=HTML, follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"].startswith("/settings/password"), path
    r = await client.get("/settings/password?next=%2Ftasks")
    assert r.status_code == 200 and 'id="password-required"' in r.text and "generated" in r.text
    r = await client.get("/api/v1/user")
    assert r.status_code == 403 and r.json()["code"] == "password_change_required"
    r = await client.get("/admin/", headers={**HTML, "HX-Request": "true"}, follow_redirects=False)
    assert r.headers["HX-Redirect"].startswith("/settings/password")
    # Tokens are separate credentials: not affected.
    assert (await client.get("/api/v1/user", headers=token)).status_code == 200
    assert (await client.get("/api/schema/swagger")).status_code == 200  # the API reference stays open

    r = await change(client, password, password)
    assert r.status_code == 422 and "this is the current one" in r.text and password_file.exists()
    r = await change(client, password, NEW, next_="/tasks")
    assert r.status_code == 200 and "Password changed" in r.text
    assert 'id="password-required"' not in r.text
    assert re.search(r'<a href="/tasks" id="password-continue">Continue</a>', r.text)
    assert not password_file.exists()
    assert not await flag(db, "root")
    assert (await client.get("/", headers=HTML, follow_redirects=False)).status_code == 200
    assert (await client.get("/api/v1/user")).status_code == 200
    async with db.session() as s:
        actions = [
            (row.action, row.target, row.detail)
            for row in (await s.execute(select(AuditEvent).order_by(AuditEvent.id))).scalars()
        ]
    assert ("instance.password_file.remove", "admin-password.txt", {}) in actions
    assert [d["was_generated"] for a, _, d in actions if a == "user.password.change"] == [True]


async def test_changing_another_accounts_password_keeps_roots_file(
    settings: Settings, db: Database, client: AsyncTestClient[Any], make: Accounts
) -> None:
    await bootstrap.ensure_admin(db, settings)
    await make.user("ana")
    await sign_in(client, "ana", PASSWORD)
    assert (await client.get("/", headers=HTML, follow_redirects=False)).status_code == 200  # not flagged
    assert (await change(client, PASSWORD, NEW)).status_code == 200
    assert (settings.data_dir / initial_password.PASSWORD_FILE).exists()


async def test_only_generated_passwords_must_be_changed(
    db: Database, client: AsyncTestClient[Any], make: Accounts
) -> None:
    await make.user("admin1", admin=True)
    h = {"Authorization": f"Bearer {await make.token('admin1', 'admin')}"}
    r = await client.post("/api/v1/admin/users", json={"login": "chosen", "password": PASSWORD}, headers=h)
    assert r.status_code == 201 and not await flag(db, "chosen")
    r = await client.post("/api/v1/admin/users", json={"login": "given"}, headers=h)
    assert r.status_code == 201 and await flag(db, "given")
    accounts = {a["login"]: a for a in (await client.get("/api/v1/admin/accounts", headers=h)).json()}
    assert accounts["given"]["must_change_password"] and not accounts["chosen"]["must_change_password"]
    r = await client.put("/api/v1/admin/accounts/given/password", json={"password": PASSWORD}, headers=h)
    assert r.status_code == 200 and not await flag(db, "given")  # an admin chose it: told in person
    r = await client.put("/api/v1/admin/accounts/chosen/password", json={}, headers=h)
    assert r.status_code == 200 and await flag(db, "chosen")

    await sign_in(client, "admin1", PASSWORD)
    csrf = csrf_from((await client.get("/admin/")).text)
    r = await client.post("/admin/accounts", data={"login": "newbie", "kind": "user", "csrf_token": csrf})
    generated = re.search(r'id="new-password">([^<]+)<', r.text)
    assert r.status_code == 200 and generated and "must choose their own" in r.text
    assert await flag(db, "newbie") and "must change password" in (await client.get("/admin/")).text
    r = await client.post("/admin/accounts/newbie/password", data={"password": NEW, "csrf_token": csrf})
    assert r.status_code == 200 and not await flag(db, "newbie")
    r = await client.post("/admin/accounts/newbie/password", data={"password": "", "csrf_token": csrf})
    assert r.status_code == 200 and await flag(db, "newbie")
