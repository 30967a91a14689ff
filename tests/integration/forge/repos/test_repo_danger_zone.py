"""Rename, transfer and delete from repository settings (the danger zone) and the transfer API:
each needs the full name typed; a refusal comes back inside its own section with what was typed.
A collaborator is removed with the row's Remove button, after a confirmation page."""

from typing import Any

from litestar.testing import AsyncTestClient
from sqlalchemy import select

from forge.db.engine import Database
from forge.db.models import AuditEvent
from tests.support.accounts import PASSWORD, Accounts
from tests.support.web import csrf_from, sign_in


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def new_repo(client: AsyncTestClient[Any], token: str, name: str = "proj") -> None:
    r = await client.post("/api/v1/user/repos", json={"name": name, "auto_init": True}, headers=bearer(token))
    assert r.status_code == 201, r.text


async def audit_rows(db: Database, action: str) -> list[AuditEvent]:
    async with db.session() as s:
        return list((await s.execute(select(AuditEvent).where(AuditEvent.action == action))).scalars())


async def test_transfer_over_the_api(client: AsyncTestClient[Any], make: Accounts, db: Database) -> None:
    await make.user("root", admin=True)
    await make.user("ana")
    await make.user("bob")
    await make.user("carol")
    ana = await make.token("ana", "repo:write")
    await new_repo(client, ana)
    await new_repo(client, await make.token("carol", "repo:write"))  # carol/proj exists
    r = await client.put("/api/v1/repos/ana/proj/collaborators/bob", json={"role": "admin"}, headers=bearer(ana))
    assert r.status_code == 200
    bob = await make.token("bob", "repo:write")
    for who, body, status, code in (
        (ana, {"new_owner": "bob", "confirm": "proj"}, 422, "confirmation_required"),
        (ana, {"new_owner": "ana", "confirm": "ana/proj"}, 422, "invalid_transfer"),
        (ana, {"new_owner": "ghost", "confirm": "ana/proj"}, 404, "account_not_found"),
        (ana, {"new_owner": "carol", "confirm": "ana/proj"}, 409, "repo_exists"),
        (bob, {"new_owner": "bob", "confirm": "ana/proj"}, 403, "forbidden"),  # a collaborator admin
        (await make.token("ana", "repo:read"), {"new_owner": "bob", "confirm": "ana/proj"}, 403, "insufficient_scope"),
    ):
        r = await client.post("/api/v1/repos/ana/proj/transfer", json=body, headers=bearer(who))
        assert (r.status_code, r.json()["code"]) == (status, code), (body, r.text)
    r = await client.post(
        "/api/v1/repos/ana/proj/transfer", json={"new_owner": "bob", "confirm": "ana/proj"}, headers=bearer(ana)
    )
    assert r.status_code == 200 and r.json()["full_name"] == "bob/proj" and r.json()["permission"] is None
    assert (await client.get("/api/v1/repos/ana/proj", headers=bearer(ana))).status_code == 404
    got = await client.get("/api/v1/repos/bob/proj", headers=bearer(bob))
    assert got.status_code == 200 and got.json()["permission"] == "admin"
    # The history came along (the bare repository moved), and bob's old explicit role is gone.
    assert (await client.get("/api/v1/repos/bob/proj/branches", headers=bearer(bob))).json()[0]["name"] == "main"
    roles = (await client.get("/api/v1/repos/bob/proj/collaborators", headers=bearer(bob))).json()
    assert roles == [{"login": "bob", "type": "User", "role": "admin"}]
    admin = await make.token("root", "admin")
    r = await client.post(
        "/api/v1/repos/bob/proj/transfer", json={"new_owner": "ana", "confirm": "bob/proj"}, headers=bearer(admin)
    )
    assert r.status_code == 200 and r.json()["full_name"] == "ana/proj"
    assert [(row.target, row.detail["transferred_from"]) for row in await audit_rows(db, "repo.transfer")] == [
        ("bob/proj", "ana/proj"),
        ("ana/proj", "bob/proj"),
    ]


async def test_the_danger_zone_renames_transfers_and_deletes(
    client: AsyncTestClient[Any], make: Accounts, db: Database
) -> None:
    await make.user("root", admin=True)
    await make.user("ana")
    await make.user("bob")
    await new_repo(client, await make.token("ana", "repo:write"))
    await sign_in(client, "ana", PASSWORD)
    page = await client.get("/ana/proj/settings/")
    csrf = csrf_from(page.text)
    assert 'id="danger-zone"' in page.text and "Only instance admins delete repositories" in page.text
    assert 'action="/ana/proj/settings/delete"' not in page.text  # not an instance admin

    r = await client.post("/ana/proj/settings/rename", data={"new_name": "app", "confirm": "proj", "csrf_token": csrf})
    assert r.status_code == 422
    section = r.text[r.text.index('id="danger-rename"') : r.text.index('id="danger-transfer"')]
    assert " open>" in section and 'id="rename-error"' in section and "type &#39;ana/proj&#39; to confirm" in section
    assert 'value="app"' in section and 'value="proj"' in section  # what was typed comes back
    form = {"new_name": "app", "confirm": "ana/proj", "csrf_token": csrf}
    r = await client.post("/ana/proj/settings/rename", data=form, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/ana/app/settings/?done=renamed#danger-zone"
    page = await client.get("/ana/app/settings/?done=renamed")
    assert "Renamed. The old address no longer works" in page.text

    form = {"new_owner": "bob", "confirm": "ana/app", "csrf_token": csrf}
    r = await client.post("/ana/app/settings/transfer", data=form)
    assert r.status_code == 200 and "ana/app was transferred" in r.text and "You no longer have a role" in r.text
    assert (await client.get("/bob/app", headers={"Accept": "text/html"})).status_code == 404  # private, bob's now

    client.cookies.clear()
    await sign_in(client, "root", PASSWORD)
    page = await client.get("/bob/app/settings/")
    csrf = csrf_from(page.text)
    r = await client.post("/bob/app/settings/delete", data={"confirm": "app", "csrf_token": csrf})
    assert r.status_code == 422 and 'id="delete-error"' in r.text
    r = await client.post("/bob/app/settings/delete", data={"confirm": "bob/app", "csrf_token": csrf})
    assert r.status_code == 200 and "bob/app was deleted" in r.text
    assert (await client.get("/bob/app", headers={"Accept": "text/html"})).status_code == 404
    assert [row.target for row in await audit_rows(db, "repo.delete")] == ["bob/app"]


async def test_a_collaborator_is_removed_with_its_row_button(client: AsyncTestClient[Any], make: Accounts) -> None:
    await make.user("ana")
    await make.user("bob")
    ana = await make.token("ana", "repo:write")
    await new_repo(client, ana)
    await client.put("/api/v1/repos/ana/proj/collaborators/bob", json={"role": "write"}, headers=bearer(ana))
    await sign_in(client, "ana", PASSWORD)
    page = await client.get("/ana/proj/settings/")
    assert 'aria-label="Remove collaborator bob"' in page.text
    assert 'value="remove"' not in page.text  # no longer a "role"
    assert 'aria-label="Remove collaborator ana"' not in page.text  # the owner stays
    assert (await client.get("/ana/proj/settings/collaborators/ana/remove")).status_code == 404
    confirm = await client.get("/ana/proj/settings/collaborators/bob/remove")
    assert confirm.status_code == 200 and "Remove bob from ana/proj?" in confirm.text
    r = await client.post(
        "/ana/proj/settings/collaborators/bob/remove",
        data={"csrf_token": csrf_from(confirm.text)},
        follow_redirects=False,
    )
    assert r.status_code == 303 and r.headers["location"].startswith("/ana/proj/settings/?done=collaborator-removed")
    page = await client.get(r.headers["location"])
    assert "Collaborator removed." in page.text and 'aria-label="Remove collaborator bob"' not in page.text
    assert (await client.get("/ana/proj/settings/collaborators/bob/remove")).status_code == 404
