"""The issue pages without a browser: the Issues tab and its filters, the new-issue form, an issue's
page (markdown sanitised, `#N` linked, the timeline), its forms (comment, close with a reason,
reopen, labels, assignees, milestone, edit), a refused form shown again with its reason, the
labels and milestones pages, and a pull request's number leading to the pull request."""

from typing import Any

from litestar.testing import AsyncTestClient

from tests.support.accounts import PASSWORD, Accounts
from tests.support.web import csrf_from, sign_in

API = "/api/v1/repos/ana/shop"


async def _repo(client: AsyncTestClient[Any], make: Accounts) -> str:
    await make.user("ana")
    await make.user("rita")
    await make.bot("demo-agent")
    ana = await make.token("ana", "repo:write")
    h = {"Authorization": f"Bearer {ana}"}
    assert (await client.post("/api/v1/user/repos", json={"name": "shop", "auto_init": True}, headers=h)).is_success
    await client.put(f"{API}/collaborators/rita", json={"role": "read"}, headers=h)
    await client.put(f"{API}/collaborators/demo-agent", json={"role": "write"}, headers=h)
    await client.post(f"{API}/labels", json={"name": "bug", "color": "d73a4a"}, headers=h)
    await client.post(f"{API}/milestones", json={"title": "v1"}, headers=h)
    return ana


async def _post(client: AsyncTestClient[Any], page: str, path: str, **fields: Any) -> Any:
    token = csrf_from((await client.get(page)).text)
    return await client.post(path, data={"csrf_token": token, **fields}, follow_redirects=False)


async def test_a_person_opens_sorts_out_discusses_and_closes_an_issue(
    client: AsyncTestClient[Any], make: Accounts
) -> None:
    ana = await _repo(client, make)
    await sign_in(client, "ana", PASSWORD)
    r = await _post(
        client, "/ana/shop/issues/new", "/ana/shop/issues",
        title="Cart total is wrong",
        body='Off by one. <script>alert(1)</script> <img src="https://evil.example/x.png"> see #1',
    )  # fmt: skip
    assert r.status_code == 303 and r.headers["location"] == "/ana/shop/issues/1"
    page = (await client.get("/ana/shop/issues/1")).text
    shown = page[page.index('id="description"') : page.index("<details", page.index('id="description"'))]
    assert "Off by one." in shown and "<script" not in shown and "evil.example" not in shown
    assert '<a href="/ana/shop/issues/1"' in shown  # `#1` is a link

    r = await _post(client, "/ana/shop/issues/1", "/ana/shop/issues/1/sidebar", sidebar="labels", labels=["bug"])
    assert r.status_code == 303 and r.headers["location"].endswith("#sidebar")
    r = await _post(client, "/ana/shop/issues/1", "/ana/shop/issues/1/sidebar", sidebar="assignees", assignees="rita")
    assert r.status_code == 303
    r = await _post(client, "/ana/shop/issues/1", "/ana/shop/issues/1/sidebar", sidebar="milestone", milestone="1")
    assert r.status_code == 303
    comment = {"body": "Fixed in **main**", "close": "completed"}
    r = await _post(client, "/ana/shop/issues/1", "/ana/shop/issues/1/comments", **comment)
    assert r.status_code == 303 and "#issuecomment-" in r.headers["location"]

    got = (await client.get(f"{API}/issues/1", headers={"Authorization": f"Bearer {ana}"})).json()
    assert got["state"] == "closed" and got["state_reason"] == "completed"
    assert [label["name"] for label in got["labels"]] == ["bug"] and got["assignees"][0]["login"] == "rita"
    assert got["milestone"]["title"] == "v1" and got["comments"] == 1
    hostile = '<a href="javascript:alert(1)">x</a> <img src="/x.png" onerror="alert(1)"> <b onclick="x()">b</b>'
    await _post(client, "/ana/shop/issues/1", "/ana/shop/issues/1/comments", body=hostile)
    page = (await client.get("/ana/shop/issues/1")).text
    start = page.index('id="issuecomment-2"')
    shown = page[start : page.index("<details", start)]  # the rendered comment (its editor holds the raw text)
    assert "<b>b</b>" in shown and "javascript:" not in shown and "onerror" not in shown and "onclick" not in shown
    for seen in ("added the label", "assigned", "added this to the milestone", "<strong>main</strong>", "closed this"):
        assert seen in page, seen
    r = await _post(client, "/ana/shop/issues/1", "/ana/shop/issues/1/state", state="open")
    assert r.status_code == 303
    listing = (await client.get("/ana/shop/issues?label=bug")).text
    assert "Cart total is wrong" in listing
    assert "Cart total is wrong" not in (await client.get("/ana/shop/issues?assignee=nobody")).text


async def test_a_refused_form_comes_back_as_typed_with_its_reason(client: AsyncTestClient[Any], make: Accounts) -> None:
    await _repo(client, make)
    await sign_in(client, "ana", PASSWORD)
    r = await _post(client, "/ana/shop/issues/new", "/ana/shop/issues", title="", body="kept text")
    assert r.status_code == 422 and "kept text" in r.text
    await _post(client, "/ana/shop/issues/new", "/ana/shop/issues", title="t", body="")
    r = await _post(client, "/ana/shop/issues/1", "/ana/shop/issues/1/sidebar", sidebar="assignees", assignees="ghost")
    assert r.status_code == 422 and "ghost" in r.text and 'value="ghost"' in r.text
    r = await _post(client, "/ana/shop/labels", "/ana/shop/labels", name="BUG", color="#000000", description="dup")
    assert r.status_code == 409 and 'value="dup"' in r.text


async def test_a_reader_comments_but_cannot_sort_out(client: AsyncTestClient[Any], make: Accounts) -> None:
    await _repo(client, make)
    await sign_in(client, "ana", PASSWORD)
    await _post(client, "/ana/shop/issues/new", "/ana/shop/issues", title="by ana", body="")
    await client.post("/signout", data={"csrf_token": csrf_from((await client.get("/")).text)})
    await sign_in(client, "rita", PASSWORD)
    page = (await client.get("/ana/shop/issues/1")).text
    assert 'id="comment-form"' in page and 'id="labels-form"' not in page and 'id="assignees-form"' not in page
    r = await _post(client, "/ana/shop/issues/1", "/ana/shop/issues/1/sidebar", sidebar="labels", labels=["bug"])
    assert r.status_code == 403
    r = await _post(client, "/ana/shop/issues/1", "/ana/shop/issues/1/comments", body="me too")
    assert r.status_code == 303


async def test_labels_milestones_and_shared_numbers(client: AsyncTestClient[Any], make: Accounts) -> None:
    await _repo(client, make)
    await sign_in(client, "ana", PASSWORD)
    r = await _post(client, "/ana/shop/labels", "/ana/shop/labels", name="docs", color="#0075ca", description="")
    assert r.status_code == 303
    assert "docs" in (await client.get("/ana/shop/labels")).text
    r = await _post(client, "/ana/shop/milestones", "/ana/shop/milestones", title="v2", due_on="2027-01-31")
    assert r.status_code == 303
    page = (await client.get("/ana/shop/milestones")).text
    assert "v2" in page and "due 2027-01-31" in page
    r = await client.post("/ana/shop/markdown", data={"body": "**hi** #3"}, headers={"X-CSRF-Token": csrf_from(page)})
    assert r.status_code == 201 and "<strong>hi</strong>" in r.text and 'href="/ana/shop/issues/3"' in r.text
    assert (await client.get("/ana/shop/issues/99")).status_code == 404
