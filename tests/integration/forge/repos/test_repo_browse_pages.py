"""The browsing pages over HTTP on a repository pushed with the git CLI: what a person reads on
each page (ref switcher, last commits, README, blame, history, commit with parents and split
diff), the 404s with their codes, binary and huge files, and an empty repository's setup steps."""

import re
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import AsyncTestClient

from tests.support.accounts import PASSWORD, Accounts
from tests.support.browse_repo import History, build_history, push_to
from tests.support.web import sign_in

HTML = {"Accept": "text/html"}


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> History:
    return build_history(tmp_path_factory.mktemp("browse") / "work")


async def _proj(
    client: AsyncTestClient[Any], make: Accounts, history: History | None, visibility: str = "private"
) -> None:
    await make.user("ana")
    token = await make.token("ana", "repo:write")
    r = await client.post(
        "/api/v1/user/repos",
        json={"name": "proj", "visibility": visibility},
        headers={"Authorization": f"Bearer {token}"},
    )
    assert r.status_code == 201, r.text
    if history is not None:
        store = client.app.state.repo_store
        push_to(history.work, Path(store.path(("ana", "proj"))))
    await sign_in(client, "ana", PASSWORD)


async def test_empty_repository_shows_setup_steps(client: AsyncTestClient[Any], make: Accounts) -> None:
    await _proj(client, make, None)
    home = await client.get("/ana/proj", headers=HTML)
    assert home.status_code == 200
    assert "This repository is empty" in home.text
    assert "git remote add origin http://testserver.local/ana/proj.git" in home.text
    assert "git push -u origin main" in home.text
    r = await client.get("/ana/proj/tree/src", headers=HTML)
    assert r.status_code == 404 and "path_not_found" in r.text


async def test_home_tree_switcher_and_readme(client: AsyncTestClient[Any], make: Accounts, history: History) -> None:
    await _proj(client, make, history)
    home = (await client.get("/ana/proj", headers=HTML)).text
    # the switcher names where you are and lists branches and tags
    switcher = home[home.index('id="ref-switcher"') :].split("</details>", 1)[0]
    assert re.search(r'class="ref-kind">branch</span> <strong class="ref-name">main</strong>', switcher)
    assert "/ana/proj/tree?ref=feature/x" in switcher and "/ana/proj/tree?ref=v1.0" in switcher
    # each entry names its last commit, with its age and exact time
    row = home[home.index("LICENSE</a>") :]
    row = row[: row.index("</tr>")]
    assert f"/ana/proj/commit/{history.initial}" in row and "Initial import" in row
    assert re.search(
        r'<time datetime="2024-01-01T00:00:00\+00:00" title="2024-01-01 00:00:00 \+0000">\d+ years? ago</time>', row
    )
    src_row = home[home.index("src</a>") :]
    assert f"/ana/proj/commit/{history.feature}" in src_row[: src_row.index("</tr>")]
    # the README is rendered and sanitised
    readme = home[home.index('id="readme"') :]
    assert "<h1>Browse me</h1>" in readme and "<em>markdown</em>" in readme
    for hostile in ("<script", "<iframe", "javascript:", "onerror", "__owned"):
        assert hostile not in readme, hostile
    assert re.search(r'aria-current="page"><svg class="icon icon-code"', home)  # the Code tab is current
    assert "<svg" in home and "📁" not in home and "📄" not in home  # inline SVG icons, no emoji


async def test_tag_folder_readme_and_breadcrumbs(
    client: AsyncTestClient[Any], make: Accounts, history: History
) -> None:
    await _proj(client, make, history)
    at_tag = (await client.get("/ana/proj/tree?ref=v1.0", headers=HTML)).text
    assert '<span class="ref-kind">tag</span> <strong class="ref-name">v1.0</strong>' in at_tag
    assert "assets" not in at_tag.split('id="tree"')[1].split("</table>")[0]
    assert f"/ana/proj/commit/{history.app_changed}" in at_tag
    full_ref = (await client.get("/ana/proj/tree?ref=refs/heads/feature/x", headers=HTML)).text
    assert '<span class="ref-kind">branch</span> <strong class="ref-name">feature/x</strong>' in full_ref
    at_sha = (await client.get(f"/ana/proj/tree?ref={history.initial}", headers=HTML)).text
    assert f'<span class="ref-kind">commit</span> <strong class="ref-name">{history.initial[:10]}</strong>' in at_sha
    docs = (await client.get("/ana/proj/tree/src/lib", headers=HTML)).text
    crumbs = docs[docs.index('class="crumbs"') : docs.index("</nav>", docs.index('class="crumbs"'))]
    assert 'href="/ana/proj/tree">proj</a>' in crumbs and 'href="/ana/proj/tree/src">src</a>' in crumbs
    assert '<strong aria-current="page">lib</strong>' in crumbs
    # a file's path under /tree/ shows the file, a folder's under /blob/ lists it
    r = await client.get("/ana/proj/tree/src/app.py?ref=feature/x", headers=HTML, follow_redirects=False)
    assert r.status_code == 302 and r.headers["location"] == "/ana/proj/blob/src/app.py?ref=feature/x"
    r = await client.get("/ana/proj/blob/src/lib", headers=HTML, follow_redirects=False)
    assert r.status_code == 302 and r.headers["location"] == "/ana/proj/tree/src/lib"
    vendor = (await client.get("/ana/proj/tree/vendor", headers=HTML)).text
    assert "(submodule)" in vendor and "icon-submodule" in vendor
    assert "/ana/proj/blob/vendor/lib" not in vendor and "/ana/proj/tree/vendor/lib" not in vendor  # not a link
    r = await client.get("/ana/proj/blob/vendor/lib", headers=HTML)
    assert r.status_code == 422 and "code: not_a_blob" in r.text  # a submodule: no file, no folder
    folder = (await client.get("/ana/proj/tree/docs", headers=HTML)).text
    assert "<h1>The docs folder</h1>" in folder and "<em>these</em>" in folder


async def test_unknown_ref_and_path_are_404_with_codes(
    client: AsyncTestClient[Any], make: Accounts, history: History
) -> None:
    await _proj(client, make, history)
    for url, code in (
        ("/ana/proj/tree?ref=nope", "ref_not_found"),
        ("/ana/proj/tree/nope", "path_not_found"),
        ("/ana/proj/blob/nope.txt", "path_not_found"),
        ("/ana/proj/blame/src/nope.py", "path_not_found"),
        ("/ana/proj/blame/src/app.py?ref=nope", "ref_not_found"),
        ("/ana/proj/commits/nope", "path_not_found"),
        ("/ana/proj/commits?ref=nope", "ref_not_found"),
        ("/ana/proj/commit/0123456789abcdef", "ref_not_found"),
        ("/ana/proj/compare/main...nope", "ref_not_found"),
    ):
        r = await client.get(url, headers=HTML)
        assert r.status_code == 404, (url, r.status_code)
        assert f"code: {code}" in r.text, url
        assert (await client.get(url)).json()["code"] == code
    r = await client.get("/ana/proj/compare/main", headers=HTML)
    assert r.status_code == 422 and "code: invalid_compare" in r.text
    r = await client.get("/ana/proj/commit/" + history.head + "?view=sideways", headers=HTML)
    assert r.status_code in (400, 422)
    client.cookies.clear()
    assert (await client.get("/ana/proj/blame/src/app.py", headers=HTML)).status_code == 404  # private


async def test_blob_binary_huge_and_blame(client: AsyncTestClient[Any], make: Accounts, history: History) -> None:
    await _proj(client, make, history)
    binary = (await client.get("/ana/proj/blob/assets/logo.bin", headers=HTML)).text
    assert 'id="binary"' in binary and "Binary file, not shown" in binary
    huge = await client.get("/ana/proj/blob/assets/huge.txt", headers=HTML)
    assert huge.status_code == 200 and 'id="too-large"' in huge.text and len(huge.text) < 200_000
    refused = (await client.get("/ana/proj/blame/assets/huge.txt", headers=HTML)).text
    assert "too large to blame" in refused
    assert "binary file" in (await client.get("/ana/proj/blame/assets/logo.bin", headers=HTML)).text
    blame = (await client.get("/ana/proj/blame/src/app.py", headers=HTML)).text
    table = blame[blame.index('id="blame"') :]
    assert f"/ana/proj/commit/{history.feature}" in table and f"/ana/proj/commit/{history.initial}" in table
    assert 'id="L2"' in table and "Greet the world" in table
    assert '<span class="k">def</span>' in table  # highlighted per line
    old = (await client.get("/ana/proj/blame/src/app.py?ref=v1.0", headers=HTML)).text
    assert f"/ana/proj/commit/{history.app_changed}" in old and history.feature not in old


async def test_log_and_path_history(client: AsyncTestClient[Any], make: Accounts, history: History) -> None:
    await _proj(client, make, history)
    log = (await client.get("/ana/proj/commits", headers=HTML)).text
    assert "Commits on <span" in log and "Add assets" in log and "<strong>Bob</strong>" in log
    assert re.search(r'<time datetime="2024-01-06T00:00:00\+00:00"', log)
    on_feature = (await client.get("/ana/proj/commits?ref=feature/x", headers=HTML)).text
    assert "Greet the world" in on_feature and "Add assets" not in on_feature
    assert '<strong class="ref-name">feature/x</strong>' in on_feature
    own = (await client.get("/ana/proj/commits/src/app.py", headers=HTML)).text
    listed = re.findall(r'<td><div class="summary"><a href="/ana/proj/commit/([0-9a-f]{40})"', own)
    assert listed == [history.feature, history.app_changed, history.initial]
    assert "History of <span" in own


async def test_commit_page_parents_files_and_split_view(
    client: AsyncTestClient[Any], make: Accounts, history: History
) -> None:
    await _proj(client, make, history)
    merge = (await client.get(f"/ana/proj/commit/{history.merge}", headers=HTML)).text
    parents = merge[merge.index('id="parents"') :].split("</dd>")[0]
    assert f"/ana/proj/commit/{history.docs_added}" in parents and f"/ana/proj/commit/{history.feature}" in parents
    page = (await client.get(f"/ana/proj/commit/{history.feature}", headers=HTML)).text
    assert "Bob &lt;bob@example.org&gt;" in page
    assert '<a href="#diff-1">' in page and 'id="diff-1"' in page
    unified = page[page.index('class="diff code unified"') :]
    added = re.search(r'<tr class="add">.*?</tr>', unified, re.S)
    assert added and '<span class="k">return</span>' in added.group(0) and "hello, world" in added.group(0)
    removed = re.search(r'<tr class="del">.*?</tr>', unified, re.S)
    assert removed and "hello" in removed.group(0) and "world" not in removed.group(0)
    split = (await client.get(f"/ana/proj/commit/{history.feature}?view=split", headers=HTML)).text
    assert 'class="diff code split"' in split
    row = re.search(
        r'<td class="src del">(.*?)</td><td class="ln add">2</td><td class="src add">(.*?)</td>', split, re.S
    )
    assert row and "hello" in row.group(1) and "hello, world" in row.group(2)
    assert 'aria-current="true" class="on">Split</a>' in split
    assets = (await client.get(f"/ana/proj/commit/{history.big_files}", headers=HTML)).text
    assert "Binary file, not shown" in assets and "too large to show" in assets


async def test_compare_page(client: AsyncTestClient[Any], make: Accounts, history: History) -> None:
    await _proj(client, make, history)
    r = await client.get(f"/ana/proj/compare/{history.docs_added}...feature/x?view=split", headers=HTML)
    assert r.status_code == 200
    assert "1 commit ahead" in r.text and "1 commits" not in r.text and "Greet the world" in r.text
    assert 'class="diff code split"' in r.text and '<a href="#diff-1">' in r.text
