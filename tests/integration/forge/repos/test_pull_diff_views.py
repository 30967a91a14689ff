"""The Files changed tab of a pull request in its two layouts, as on the compare and commit pages:
unified by default, side by side with `?view=split` (the same Unified / Split switch), and in
both a comment form on every line and the threads under the lines they are about."""

import re
from typing import Any

from litestar.testing import AsyncTestClient

from forge.git import Identity
from forge.git.bare import write_commit
from tests.support.accounts import PASSWORD, Accounts
from tests.support.web import csrf_from, sign_in

API = "/api/v1/repos/ana/shop"
ANA = Identity(name="Ana", email="ana@example.org")
PAGE = "/ana/shop/pull/1/files"


async def _pull(client: AsyncTestClient[Any], make: Accounts) -> int:
    """`price.py` changed on `change` (line 2 replaced, a line added), pull request #1 open, and
    bob's comment on the new line 2; returns the comment's id."""
    await make.user("ana")
    await make.user("bob")
    h = {"Authorization": f"Bearer {await make.token('ana', 'repo:write', 'reviews:write')}"}
    bob = {"Authorization": f"Bearer {await make.token('bob', 'repo:write', 'reviews:write')}"}
    assert (await client.post("/api/v1/user/repos", json={"name": "shop", "auto_init": True}, headers=h)).is_success
    assert (await client.put(f"{API}/collaborators/bob", json={"role": "write"}, headers=h)).is_success
    store = client.app.state.repo_store
    old, new = "def price():\n    return 10\n", "def price():\n    return 12\n# in euros\n"
    await store.write(("ana", "shop"), write_commit, branch="main", files={"price.py": old}, message="p", author=ANA)
    main = next(b["sha"] for b in (await client.get(f"{API}/branches", headers=h)).json() if b["name"] == "main")
    await store.write(("ana", "shop"), lambda repo: repo.references.create("refs/heads/change", main))
    await store.write(("ana", "shop"), write_commit, branch="change", files={"price.py": new}, message="12", author=ANA)
    r = await client.post(f"{API}/pulls", json={"title": "Twelve", "head": "change", "base": "main"}, headers=h)
    assert r.status_code == 201, r.text
    r = await client.post(f"{API}/pulls/1/comments", json={"body": "why **12**?", "path": "price.py", "line": 2},
                          headers=bob)  # fmt: skip
    assert r.status_code == 201, r.text
    return int(r.json()["id"])


def _table(html: str) -> str:
    return html[html.index('data-path="price.py"') :].split("</table>")[0]


async def test_the_files_tab_splits_the_diff_and_keeps_its_comments(
    client: AsyncTestClient[Any], make: Accounts
) -> None:
    comment = await _pull(client, make)
    await sign_in(client, "ana", PASSWORD)
    unified = (await client.get(PAGE)).text
    assert '<table class="diff" data-path="price.py"' in unified
    assert 'href="/ana/shop/pull/1/files?view=unified#files" aria-current="true" class="on">Unified</a>' in unified
    assert '<tr class="del" data-side="LEFT" data-line="2"' in _table(unified)

    r = await client.get(f"{PAGE}?view=split")
    assert r.status_code == 200
    split = r.text
    assert 'href="/ana/shop/pull/1/files?view=split#files" aria-current="true" class="on">Split</a>' in split
    table = _table(split)
    assert '<table class="diff split" data-path="price.py"' in split
    # the replaced line: the old one on the left, the new one beside it on the same row
    row = re.search(r"<tr>(?:(?!</tr>).)*?<td class=\"src del\">    return 10</td>(?:(?!</tr>).)*?</tr>", table, re.S)
    assert row is not None, table
    assert 'data-side="LEFT" data-line="2"' in row.group(0) and '<td class="src add">    return 12</td>' in row.group(0)
    assert 'data-side="RIGHT" data-line="2"' in row.group(0)
    # a line only added has nothing beside it
    added = re.search(r'<td class="ln empty"></td><td class="src empty"></td>(?:(?!</tr>).)*?# in euros', table, re.S)
    assert added is not None, table
    # a comment form for each side of the replaced line, and bob's thread under the new line 2
    assert 'aria-label="Comment on price.py line 2"' in row.group(0)
    assert row.group(0).count('class="add-comment"') == 2
    assert '<input type="hidden" name="side" value="LEFT"><input type="hidden" name="line" value="2">' in row.group(0)
    after = table[table.index(row.group(0)) + len(row.group(0)) :]
    assert after.lstrip().startswith('<tr class="inline-thread"><td colspan="6">')
    assert f'id="comment-{comment}"' in after and "why <strong>12</strong>?" in after

    # a line comment written in the split view lands on the line it names
    posted = await client.post(
        "/ana/shop/pull/1/comments",
        data={"csrf_token": csrf_from(split), "path": "price.py", "side": "LEFT", "line": "2", "body": "was ten"},
        follow_redirects=False,
    )
    assert posted.status_code == 303, posted.text
    reader = {"Authorization": f"Bearer {await make.token('ana', 'repo:read')}"}
    listed = (await client.get(f"{API}/pulls/1/comments", headers=reader)).json()
    assert [(c["path"], c["side"], c["line"], c["body"]) for c in listed][-1] == ("price.py", "LEFT", 2, "was ten")
    again = _table((await client.get(f"{PAGE}?view=split")).text)
    assert "was ten" in again
