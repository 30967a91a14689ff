"""Repositories through REST and the web UI: create, names, visibility, collaborators, browse, raw,
compare, settings, and the 404-below-read rule."""

from typing import Any

from litestar.testing import AsyncTestClient

from forge.git import Identity
from forge.git.bare import write_commit
from tests.support.accounts import PASSWORD, Accounts
from tests.support.web import csrf_from, sign_in


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def _repo_with_files(client: AsyncTestClient[Any], token: str, files: dict[str, bytes | str]) -> None:
    r = await client.post("/api/v1/user/repos", json={"name": "proj", "auto_init": True}, headers=bearer(token))
    assert r.status_code == 201, r.text
    store = client.app.state.repo_store
    await store.write(
        ("ana", "proj"), write_commit, branch="main", files=files, message="files",
        author=Identity(name="Ana", email="ana@example.org"),
    )  # fmt: skip


async def test_names_are_validated(client: AsyncTestClient[Any], make: Accounts) -> None:
    await make.user("ana")
    token = await make.token("ana", "repo:write")
    for bad in ("..", "a/b", ".hidden", "-dash", "x.git", "a" * 101, "na me", "con\x00"):
        r = await client.post("/api/v1/user/repos", json={"name": bad}, headers=bearer(token))
        assert r.status_code == 422, (bad, r.text)
        assert r.json()["code"] in {"invalid_name", "validation_failed"}
    assert (await client.post("/api/v1/user/repos", json={"name": "ok"}, headers=bearer(token))).status_code == 201
    r = await client.post("/api/v1/user/repos", json={"name": "OK"}, headers=bearer(token))
    assert r.status_code == 409 and r.json()["code"] == "repo_exists"
    reader = await make.token("ana", "repo:read")
    r = await client.post("/api/v1/user/repos", json={"name": "nope"}, headers=bearer(reader))
    assert r.status_code == 403 and r.json()["code"] == "insufficient_scope"


async def test_visibility_and_404_below_read(client: AsyncTestClient[Any], make: Accounts) -> None:
    await make.user("ana")
    await make.user("bob")
    ana = await make.token("ana", "repo:write")
    bob = await make.token("bob", "repo:write")
    await client.post("/api/v1/user/repos", json={"name": "secret"}, headers=bearer(ana))
    assert (await client.get("/api/v1/repos/ana/secret", headers=bearer(bob))).status_code == 404
    assert (await client.get("/api/v1/repos/ana/secret")).status_code == 404
    assert (await client.get("/api/v1/repos/ana/nothing", headers=bearer(bob))).status_code == 404
    # bob cannot change it either, and learns nothing
    r = await client.patch("/api/v1/repos/ana/secret", json={"visibility": "public"}, headers=bearer(bob))
    assert r.status_code == 404
    r = await client.patch("/api/v1/repos/ana/secret", json={"visibility": "internal"}, headers=bearer(ana))
    assert r.json()["visibility"] == "internal"
    got = await client.get("/api/v1/repos/ana/secret", headers=bearer(bob))
    assert got.status_code == 200 and got.json()["permission"] == "read"
    assert (await client.get("/api/v1/repos/ana/secret")).status_code == 404  # anonymous: internal is not public
    r = await client.patch("/api/v1/repos/ana/secret", json={"description": "x"}, headers=bearer(bob))
    assert r.status_code == 403
    listing = await client.get("/api/v1/repos", headers=bearer(bob))
    assert [x["full_name"] for x in listing.json()] == ["ana/secret"]


async def test_collaborators_rename_archive_delete(client: AsyncTestClient[Any], make: Accounts) -> None:
    await make.user("root", admin=True)
    await make.user("ana")
    await make.bot("helper")
    ana = await make.token("ana", "repo:write")
    await client.post("/api/v1/user/repos", json={"name": "proj", "auto_init": True}, headers=bearer(ana))
    r = await client.put("/api/v1/repos/ana/proj/collaborators/helper", json={"role": "write"}, headers=bearer(ana))
    assert r.json() == {"login": "helper", "type": "Bot", "role": "write"}
    r = await client.put("/api/v1/repos/ana/proj/collaborators/ghost", json={"role": "write"}, headers=bearer(ana))
    assert r.status_code == 404
    r = await client.put("/api/v1/repos/ana/proj/collaborators/helper", json={"role": "owner"}, headers=bearer(ana))
    assert r.status_code == 422
    roles = (await client.get("/api/v1/repos/ana/proj/collaborators", headers=bearer(ana))).json()
    assert {c["login"]: c["role"] for c in roles} == {"ana": "admin", "helper": "write"}
    r = await client.patch("/api/v1/repos/ana/proj", json={"name": "renamed"}, headers=bearer(ana))
    assert r.json()["full_name"] == "ana/renamed"
    assert (await client.get("/api/v1/repos/ana/renamed/branches", headers=bearer(ana))).json()[0]["name"] == "main"
    r = await client.patch("/api/v1/repos/ana/renamed", json={"default_branch": "nope"}, headers=bearer(ana))
    assert r.status_code == 422 and r.json()["code"] == "branch_not_found"
    # only instance admins delete, after typing the name
    r = await client.request(
        "DELETE", "/api/v1/repos/ana/renamed", json={"confirm": "ana/renamed"}, headers=bearer(ana)
    )
    assert r.status_code == 403
    admin = await make.token("root", "admin")
    r = await client.request("DELETE", "/api/v1/repos/ana/renamed", json={"confirm": "renamed"}, headers=bearer(admin))
    assert r.status_code == 422 and r.json()["code"] == "confirmation_required"
    r = await client.request(
        "DELETE", "/api/v1/repos/ana/renamed", json={"confirm": "ana/renamed"}, headers=bearer(admin)
    )
    assert r.status_code == 204
    assert (await client.get("/api/v1/repos/ana/renamed", headers=bearer(admin))).status_code == 404


async def test_browse_api_raw_and_compare(client: AsyncTestClient[Any], make: Accounts) -> None:
    await make.user("ana")
    ana = await make.token("ana", "repo:write")
    await _repo_with_files(
        client, ana, {"src/app.py": "print('hi')\n", "page.html": "<script>alert(1)</script>", "bin.dat": b"\x00\x01"}
    )
    tree = (await client.get("/api/v1/repos/ana/proj/contents", headers=bearer(ana))).json()
    assert {e["name"] for e in tree["entries"]} == {"src", "README.md", "page.html", "bin.dat"}
    blob = (await client.get("/api/v1/repos/ana/proj/contents/src/app.py", headers=bearer(ana))).json()
    assert blob["text"] == "print('hi')\n"
    raw = await client.get("/api/v1/repos/ana/proj/raw/main/page.html", headers=bearer(ana))
    assert raw.status_code == 200 and raw.content == b"<script>alert(1)</script>"
    assert raw.headers["content-type"].startswith("text/plain")  # never served as HTML
    assert raw.headers["x-content-type-options"] == "nosniff"
    assert raw.headers.get_list("content-security-policy") == [
        "default-src 'none'; style-src 'unsafe-inline'; sandbox"
    ]  # its own, stricter than every page's
    for bad in ("/contents/../../etc/passwd", "/contents/.git/config", "/raw/main/..%2F..%2Fsecret"):
        r = await client.get(f"/api/v1/repos/ana/proj{bad}", headers=bearer(ana))
        assert r.status_code in (404, 422), (bad, r.status_code)
    commits = (await client.get("/api/v1/repos/ana/proj/commits", headers=bearer(ana))).json()
    assert [c["summary"] for c in commits["commits"]] == ["files", "Initial commit"]
    first, second = commits["commits"][1]["sha"], commits["commits"][0]["sha"]
    cmp = (await client.get(f"/api/v1/repos/ana/proj/compare/{first}...{second}", headers=bearer(ana))).json()
    assert cmp["ahead_by"] == 1 and {f["path"] for f in cmp["files"]} == {"src/app.py", "page.html", "bin.dat"}
    assert next(f for f in cmp["files"] if f["path"] == "bin.dat")["is_binary"] is True
    r = await client.get("/api/v1/repos/ana/proj/compare/main", headers=bearer(ana))
    assert r.status_code == 422
    r = await client.get("/api/v1/repos/ana/proj/commits/deadbeef00", headers=bearer(ana))
    assert r.status_code == 404


async def test_web_pages_create_browse_and_settings(client: AsyncTestClient[Any], make: Accounts) -> None:
    await make.user("ana")
    await make.user("bob")
    await sign_in(client, "ana", PASSWORD)
    form = await client.get("/repos/new")
    r = await client.post(
        "/repos/new",
        data={"name": "web", "visibility": "private", "auto_init": "1", "csrf_token": csrf_from(form.text)},
        follow_redirects=False,
    )
    assert r.status_code == 303 and r.headers["location"] == "/ana/web"
    store = client.app.state.repo_store
    await store.write(
        ("ana", "web"), write_commit, branch="main",
        files={"README.md": "# Title\n<script>alert('x')</script><img src=x onerror=alert(1)>\n", "a.py": "x = 1\n"},
        message="readme", author=Identity(name="Ana", email="ana@example.org"),
    )  # fmt: skip
    home = await client.get("/ana/web")
    assert home.status_code == 200
    assert "<h1>Title</h1>" in home.text and "<script>alert" not in home.text and "onerror" not in home.text
    blob = await client.get("/ana/web/blob/a.py")
    assert blob.status_code == 200 and 'class="code"' in blob.text
    assert (await client.get("/ana/web/commits")).status_code == 200
    assert (await client.get("/ana/web/branches")).status_code == 200
    settings = await client.get("/ana/web/settings/")
    r = await client.post(
        "/ana/web/settings/collaborators",
        data={"login": "bob", "role": "write", "csrf_token": csrf_from(settings.text)},
    )
    assert r.status_code == 200 and "bob" in r.text
    r = await client.post(
        "/ana/web/settings/rules", data={"pattern": "release/*", "csrf_token": csrf_from(settings.text)}
    )
    assert "release/*" in r.text and "no checks required" in r.text
    rule = {"pattern": "main", "required_checks": "ci/build, lint", "csrf_token": csrf_from(settings.text)}
    r = await client.post("/ana/web/settings/rules", data=rule)
    assert "checks required: ci/build, lint" in r.text
    # bob (write) sees the repository but not its settings
    client.cookies.clear()
    await sign_in(client, "bob", PASSWORD)
    assert (await client.get("/ana/web")).status_code == 200
    assert (await client.get("/ana/web/settings/")).status_code == 403
    client.cookies.clear()
    assert (await client.get("/ana/web", headers={"Accept": "text/html"})).status_code == 404
