"""The pull request page's forms without a browser: close and reopen, a suggestion committed from
its button, a thread resolved, and a refused form shown again with its reason (not an error page)."""

from typing import Any

from litestar.testing import AsyncTestClient

from forge.git import Identity
from forge.git.bare import write_commit
from tests.support.accounts import PASSWORD, Accounts
from tests.support.web import csrf_from, sign_in

API = "/api/v1/repos/ana/shop"
ANA = Identity(name="Ana", email="ana@example.org")


async def _pull(client: AsyncTestClient[Any], make: Accounts) -> tuple[str, int]:
    """ana's repository with a branch `change` one commit ahead of main, its pull request open, and
    bob's line comment suggesting a change; returns bob's token and the comment's id."""
    await make.user("ana")
    await make.user("bob")
    ana = await make.token("ana", "repo:write", "reviews:write")
    bob = await make.token("bob", "repo:write", "reviews:write")
    h = {"Authorization": f"Bearer {ana}"}
    assert (await client.post("/api/v1/user/repos", json={"name": "shop", "auto_init": True}, headers=h)).is_success
    await client.put(f"{API}/collaborators/bob", json={"role": "write"}, headers=h)
    store = client.app.state.repo_store
    main = (await client.get(f"{API}/branches", headers=h)).json()[0]["sha"]
    await store.write(("ana", "shop"), lambda repo: repo.references.create("refs/heads/change", main))
    await store.write(("ana", "shop"), write_commit, branch="change", files={"a.txt": "one\n"}, message="a", author=ANA)
    r = await client.post(f"{API}/pulls", json={"title": "A", "head": "change", "base": "main"}, headers=h)
    assert r.status_code == 201, r.text
    body = "```suggestion\nONE\n```"
    comment = {"body": body, "path": "a.txt", "line": 1}
    r = await client.post(f"{API}/pulls/1/comments", json=comment, headers={"Authorization": f"Bearer {bob}"})
    assert r.status_code == 201, r.text
    return bob, int(r.json()["id"])


async def _form(client: AsyncTestClient[Any], path: str, **fields: str) -> Any:
    page = await client.get("/ana/shop/pull/1")
    return await client.post(path, data={"csrf_token": csrf_from(page.text), **fields}, follow_redirects=False)


async def test_the_page_forms_act_and_come_back(client: AsyncTestClient[Any], make: Accounts) -> None:
    bob, comment = await _pull(client, make)
    await sign_in(client, "ana", PASSWORD)
    closed = await _form(client, "/ana/shop/pull/1/state", state="closed")
    assert closed.status_code == 303 and closed.headers["location"] == "/ana/shop/pull/1"
    assert (await client.get(f"{API}/pulls/1", headers={"Authorization": f"Bearer {bob}"})).json()["state"] == "closed"
    assert (await _form(client, "/ana/shop/pull/1/state", state="open")).status_code == 303

    applied = await _form(client, f"/ana/shop/pull/1/comments/{comment}/apply")
    assert applied.status_code == 303 and applied.headers["location"] == "/ana/shop/pull/1#files"
    pull = (await client.get(f"{API}/pulls/1", headers={"Authorization": f"Bearer {bob}"})).json()
    blob = await client.get(f"{API}/raw/{pull['head']['sha']}/a.txt", headers={"Authorization": f"Bearer {bob}"})
    assert blob.text == "ONE\n"

    resolved = await _form(client, f"/ana/shop/pull/1/comments/{comment}/resolve")
    assert resolved.headers["location"] == f"/ana/shop/pull/1#comment-{comment}"
    assert "resolved by ana" in (await client.get("/ana/shop/pull/1")).text

    # applied once, the suggestion is on an older head: refused on the page, with the reason
    again = await _form(client, f"/ana/shop/pull/1/comments/{comment}/apply")
    assert again.status_code == 409 and "it no longer applies as written" in again.text
    assert 'id="pull-error"' in again.text
