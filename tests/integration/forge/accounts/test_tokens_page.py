"""The tokens page: creating redirects (a reload never mints a second token) and shows the secret
once; revoking asks first; a refused form comes back with its values."""

import re
from typing import Any

from litestar.testing import AsyncTestClient

from tests.support.accounts import PASSWORD, Accounts
from tests.support.web import csrf_from, sign_in


async def test_create_redirects_and_shows_the_secret_once(client: AsyncTestClient[Any], make: Accounts) -> None:
    await make.user("ana")
    await sign_in(client, "ana", PASSWORD)
    csrf = csrf_from((await client.get("/settings/tokens/")).text)
    form = {"name": "laptop", "scopes": "repo:read", "csrf_token": csrf}
    r = await client.post("/settings/tokens/", data=form, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/settings/tokens/"
    shown = await client.get("/settings/tokens/")
    secret = re.search(r'id="new-token">(fh_\w+)<', shown.text)
    assert secret, shown.text
    assert 'aria-label="Copy the new token to the clipboard"' in shown.text
    again = await client.get("/settings/tokens/")  # a reload: nothing new, the secret is gone
    assert secret.group(1) not in again.text
    listed = (await client.get("/api/v1/user/tokens")).json()
    assert [t["name"] for t in listed] == ["laptop"]
    for column in ("Name", "Scopes", "Created", "Last used", "Expires", "Last characters"):
        assert f">{column}</th>" in again.text


async def test_revoking_asks_first(client: AsyncTestClient[Any], make: Accounts) -> None:
    await make.user("ana")
    await sign_in(client, "ana", PASSWORD)
    token = await make.token("ana", "repo:read")
    [info] = (await client.get("/api/v1/user/tokens")).json()
    listing = await client.get("/settings/tokens/")
    assert f'href="/settings/tokens/{info["id"]}/revoke"' in listing.text
    confirm = await client.get(f"/settings/tokens/{info['id']}/revoke")
    assert confirm.status_code == 200 and "Revoke token test?" in confirm.text and token[-8:] in confirm.text
    assert (await client.get("/api/v1/user", headers={"Authorization": f"Bearer {token}"})).status_code == 200
    r = await client.post(
        f"/settings/tokens/{info['id']}/revoke", data={"csrf_token": csrf_from(confirm.text)}, follow_redirects=False
    )
    assert r.status_code == 303
    assert (await client.get("/api/v1/user", headers={"Authorization": f"Bearer {token}"})).status_code == 401
    assert (await client.get(f"/settings/tokens/{info['id']}/revoke")).status_code == 404


async def test_a_refused_form_keeps_its_values(client: AsyncTestClient[Any], make: Accounts) -> None:
    await make.user("ana")
    await sign_in(client, "ana", PASSWORD)
    csrf = csrf_from((await client.get("/settings/tokens/")).text)
    data = {"name": "ci box", "scopes": "tasks:read", "expires_days": "99999", "csrf_token": csrf}
    r = await client.post("/settings/tokens/", data=data)
    assert r.status_code == 422 and 'id="token-error"' in r.text and "expiry is 1-3650 days" in r.text
    assert 'value="ci box"' in r.text and 'value="99999"' in r.text
    assert 'value="tasks:read" checked' in r.text


async def test_a_planted_cookie_cannot_show_a_false_secret(client: AsyncTestClient[Any], make: Accounts) -> None:
    """Someone who can set a cookie for the site names a real token and a made-up secret with the
    right last eight characters: the page shows no secret (the victim would copy a useless one)."""
    await make.user("ana")
    await sign_in(client, "ana", PASSWORD)
    csrf = csrf_from((await client.get("/settings/tokens/")).text)
    form = {"name": "laptop", "scopes": "repo:read", "csrf_token": csrf}
    await client.post("/settings/tokens/", data=form, follow_redirects=False)
    real = re.search(r'id="new-token">(fh_\w+)<', (await client.get("/settings/tokens/")).text)
    assert real
    token_id = (await client.get("/api/v1/user/tokens")).json()[0]["id"]
    fake = "fh_attackerchosen" + real.group(1)[-8:]
    client.cookies.set("fh_new_token", f"{token_id}.{fake}", path="/settings/tokens/")
    page = (await client.get("/settings/tokens/")).text
    assert 'id="new-token"' not in page and fake not in page
