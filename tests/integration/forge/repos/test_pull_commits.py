"""A pull request's commits, as a client and a person read them: `GET .../pulls/{number}/commits`
in GitHub's shape (oldest first, paginated, the same after the merge) and the page's Commits tab
linking each commit's page."""

import re
from datetime import datetime, timedelta, timezone
from typing import Any

from litestar.testing import AsyncTestClient

from forge.git import Identity
from forge.git.bare import write_commit
from tests.support.accounts import PASSWORD, Accounts
from tests.support.web import sign_in

API = "/api/v1/repos/ana/shop"
ANA = Identity(name="Ana", email="ana@example.org")
BOB = Identity(name="Bob", email="bob@example.org")
AT = datetime(2024, 5, 1, 12, 0, tzinfo=timezone(timedelta(hours=2)))  # 10:00 UTC


async def _three_commits(client: AsyncTestClient[Any], make: Accounts) -> tuple[dict[str, str], str, list[str]]:
    """ana's `shop` with a branch `change` three commits ahead of main (bob wrote the second, ana
    committed it), its pull request #1 open; returns ana's headers, main's tip and the commits."""
    await make.user("ana")
    await make.user("rita")
    h = {"Authorization": f"Bearer {await make.token('ana', 'repo:write', 'reviews:write')}"}
    assert (await client.post("/api/v1/user/repos", json={"name": "shop", "auto_init": True}, headers=h)).is_success
    assert (await client.put(f"{API}/collaborators/rita", json={"role": "read"}, headers=h)).is_success
    store = client.app.state.repo_store
    main = (await client.get(f"{API}/branches", headers=h)).json()[0]["sha"]
    await store.write(("ana", "shop"), lambda repo: repo.references.create("refs/heads/change", main))
    shas = []
    for i, (files, message, author) in enumerate(
        [
            ({"a.txt": "one\n"}, "Add a", ANA),
            ({"b.txt": "two\n"}, "Add b\n\nBob's part, with a body.\n", BOB),
            ({"a.txt": "ONE\n"}, "Shout a", ANA),
        ]
    ):
        sha = await store.write(
            ("ana", "shop"), write_commit, branch="change", files=files, message=message, author=author,
            committer=ANA, when=AT + timedelta(minutes=i),
        )  # fmt: skip
        shas.append(sha)
    r = await client.post(f"{API}/pulls", json={"title": "Change", "head": "change", "base": "main"}, headers=h)
    assert r.status_code == 201, r.text
    return h, main, shas


async def test_a_pull_requests_commits_over_the_api(client: AsyncTestClient[Any], make: Accounts) -> None:
    h, main, shas = await _three_commits(client, make)
    r = await client.get(f"{API}/pulls/1/commits", headers=h)
    assert r.status_code == 200, r.text
    listed = r.json()
    assert [c["sha"] for c in listed] == shas  # oldest first
    second = listed[1]
    assert second["commit"] == {
        "message": "Add b\n\nBob's part, with a body.\n",
        "author": {"name": "Bob", "email": "bob@example.org", "date": "2024-05-01T10:01:00Z"},
        "committer": {"name": "Ana", "email": "ana@example.org", "date": "2024-05-01T10:01:00Z"},
    }
    assert second["html_url"] == f"http://testserver.local/ana/shop/commit/{shas[1]}"
    assert second["url"] == f"http://testserver.local{API}/commits/{shas[1]}"
    assert [p["sha"] for p in second["parents"]] == [shas[0]]
    assert [p["sha"] for p in listed[0]["parents"]] == [main]
    assert listed[0]["parents"][0]["html_url"] == f"http://testserver.local/ana/shop/commit/{main}"

    # paginated as the other lists: page and per_page
    pages = [(await client.get(f"{API}/pulls/1/commits?per_page=2&page={n}", headers=h)).json() for n in (1, 2, 3)]
    assert [[c["sha"] for c in p] for p in pages] == [shas[:2], shas[2:], []]
    assert (await client.get(f"{API}/pulls/1/commits?per_page=101", headers=h)).status_code == 422
    # a reader reads them too; an unknown pull request is the pull request's 404
    rita = {"Authorization": f"Bearer {await make.token('rita', 'repo:read')}"}
    assert [c["sha"] for c in (await client.get(f"{API}/pulls/1/commits", headers=rita)).json()] == shas
    missing = await client.get(f"{API}/pulls/9/commits", headers=h)
    assert missing.status_code == 404 and missing.json()["code"] == "pull_not_found"

    # merged, the pull request keeps listing what it brought (read against the base it had)
    merged = await client.put(f"{API}/pulls/1/merge", json={"strategy": "merge"}, headers=h)
    assert merged.status_code == 200, merged.text
    assert [c["sha"] for c in (await client.get(f"{API}/pulls/1/commits", headers=h)).json()] == shas


async def test_the_commits_tab_links_each_commit(client: AsyncTestClient[Any], make: Accounts) -> None:
    _, _, shas = await _three_commits(client, make)
    await sign_in(client, "ana", PASSWORD)
    page = await client.get("/ana/shop/pull/1/commits")
    assert page.status_code == 200
    tabs = page.text[page.text.index('aria-label="Pull request"') :].split("</nav>")[0]
    assert re.search(r'href="/ana/shop/pull/1/commits#commits" aria-current="page">Commits \(3\)</a>', tabs)
    listed = page.text[page.text.index('id="pull-commits"') :].split("</table>")[0]
    summaries = re.findall(r'<div class="summary"><a href="/ana/shop/commit/([0-9a-f]{40})">([^<]*)</a>', listed)
    assert summaries == [(shas[0], "Add a"), (shas[1], "Add b"), (shas[2], "Shout a")]
    assert "<strong>Bob</strong> authored" in listed and "committed by Ana" in listed
    # each link leads to that commit's page
    commit = await client.get(f"/ana/shop/commit/{shas[1]}")
    assert commit.status_code == 200 and "Bob&#39;s part, with a body." in commit.text
    # a path that names no tab is a 404 (the three tabs are /pull/1, /commits and /files)
    assert (await client.get("/ana/shop/pull/1/checks")).status_code == 404
    # the conversation tab lists them as well, and is the current tab there
    conversation = (await client.get("/ana/shop/pull/1")).text
    assert 'href="/ana/shop/pull/1" aria-current="page">Conversation</a>' in conversation
    assert f'href="/ana/shop/commit/{shas[2]}">Shout a</a>' in conversation
