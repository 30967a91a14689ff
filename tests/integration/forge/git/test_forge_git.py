"""The real `git` CLI against a real forgehand server on 127.0.0.1: clone, fetch, push, rules."""

from pathlib import Path

import httpx
import pytest

from tests.support.accounts import LiveServer, make_account_with_token, run_sync
from tests.support.git import git


class Forge:
    def __init__(self, server: LiveServer) -> None:
        self.server = server
        self.url = server.url

    def token(self, login: str, *scopes: str, admin: bool = False) -> str:
        return run_sync(make_account_with_token(self.server.settings, login, *scopes, admin=admin))

    def api(self, method: str, path: str, token: str, **kw: object) -> httpx.Response:
        return httpx.request(
            method, f"{self.url}{path}", headers={"Authorization": f"Bearer {token}"}, timeout=30, **kw
        )  # type: ignore[arg-type]

    def clone_url(self, repo: str, token: str | None = None, login: str = "x") -> str:
        host = self.url.removeprefix("http://")
        return f"http://{login}:{token}@{host}/{repo}.git" if token else f"{self.url}/{repo}.git"


@pytest.fixture
def forge(live_server: LiveServer) -> Forge:
    return Forge(live_server)


def test_clone_push_and_rules(forge: Forge, tmp_path: Path) -> None:
    ana = forge.token("ana", "repo:write")
    r = forge.api("POST", "/api/v1/user/repos", ana, json={"name": "demo", "auto_init": True})
    assert r.status_code == 201, r.text
    assert r.json()["clone_url"] == f"{forge.url}/ana/demo.git"

    work = tmp_path / "work"
    git("clone", forge.clone_url("ana/demo", ana), str(work), cwd=tmp_path)
    assert (work / "README.md").exists()

    # a new branch and a fast-forward
    git("checkout", "-b", "feature", cwd=work)
    (work / "a.txt").write_text("one\n")
    git("add", ".", cwd=work)
    git("commit", "-m", "add a", cwd=work)
    git("push", "origin", "feature", cwd=work)
    git("checkout", "main", cwd=work)
    git("merge", "--ff-only", "feature", cwd=work)
    git("push", "origin", "main", cwd=work)
    branches = forge.api("GET", "/api/v1/repos/ana/demo/branches", ana).json()
    assert {b["name"] for b in branches} == {"main", "feature"}

    # force-push to the protected default branch is refused, the branch is untouched
    before = git("rev-parse", "origin/main", cwd=work).stdout.strip()
    git("reset", "--hard", "HEAD~1", cwd=work)
    (work / "b.txt").write_text("rewritten\n")
    git("add", ".", cwd=work)
    git("commit", "-m", "rewrite", cwd=work)
    refused = git("push", "--force", "origin", "main", cwd=work, check=False)
    assert refused.returncode != 0
    assert "force-push" in refused.stderr
    assert (
        git("ls-remote", forge.clone_url("ana/demo", ana), "refs/heads/main", cwd=tmp_path).stdout.split()[0] == before
    )

    # deleting the default branch is refused; deleting a feature branch is fine
    refused = git("push", "origin", ":main", cwd=work, check=False)
    assert refused.returncode != 0 and "deletion" in refused.stderr
    git("push", "origin", ":feature", cwd=work)

    # agent/* is forgehand's: a writer cannot push there
    bob = forge.token("bob", "repo:write")
    assert forge.api("PUT", "/api/v1/repos/ana/demo/collaborators/bob", ana, json={"role": "write"}).status_code == 200
    bob_work = tmp_path / "bob"
    git("clone", forge.clone_url("ana/demo", bob, "bob"), str(bob_work), cwd=tmp_path)
    git("checkout", "-b", "agent/1-x", cwd=bob_work)
    refused = git("push", "origin", "agent/1-x", cwd=bob_work, check=False)
    assert refused.returncode != 0 and "agent" in refused.stderr

    # the push was recorded in the audit log
    admin = forge.token("root", "admin", admin=True)
    audit = forge.api("GET", "/api/v1/admin/audit?limit=200", admin).json()
    pushes = [a for a in audit if a["action"] == "repo.push"]
    assert pushes and all(a["target"] == "ana/demo" for a in pushes)


def test_read_only_collaborator_and_scopes(forge: Forge, tmp_path: Path) -> None:
    ana = forge.token("ana", "repo:write")
    forge.api("POST", "/api/v1/user/repos", ana, json={"name": "private", "auto_init": True})
    carol = forge.token("carol", "repo:write")
    # not a collaborator: 404 (the repository's existence does not leak)
    r = git("clone", forge.clone_url("ana/private", carol), str(tmp_path / "c1"), cwd=tmp_path, check=False)
    assert r.returncode != 0 and ("not found" in r.stderr or "404" in r.stderr)
    forge.api("PUT", "/api/v1/repos/ana/private/collaborators/carol", ana, json={"role": "read"})
    git("clone", forge.clone_url("ana/private", carol), str(tmp_path / "c2"), cwd=tmp_path)
    (tmp_path / "c2" / "x").write_text("x")
    git("add", ".", cwd=tmp_path / "c2")
    git("commit", "-m", "x", cwd=tmp_path / "c2")
    r = git("push", "origin", "main", cwd=tmp_path / "c2", check=False)
    assert r.returncode != 0 and "403" in r.stderr
    # a read-only token of a writer cannot push either
    reader = forge.token("dan", "repo:read")
    forge.api("PUT", "/api/v1/repos/ana/private/collaborators/dan", ana, json={"role": "write"})
    git("clone", forge.clone_url("ana/private", reader), str(tmp_path / "d"), cwd=tmp_path)
    (tmp_path / "d" / "y").write_text("y")
    git("add", ".", cwd=tmp_path / "d")
    git("commit", "-m", "y", cwd=tmp_path / "d")
    r = git("push", "origin", "main", cwd=tmp_path / "d", check=False)
    assert r.returncode != 0 and "403" in r.stderr


def test_anonymous_public_clone_private_asks_for_credentials(forge: Forge, tmp_path: Path) -> None:
    ana = forge.token("ana", "repo:write")
    forge.api("POST", "/api/v1/user/repos", ana, json={"name": "open", "auto_init": True, "visibility": "public"})
    forge.api("POST", "/api/v1/user/repos", ana, json={"name": "closed", "auto_init": True})
    git("clone", forge.clone_url("ana/open"), str(tmp_path / "open"), cwd=tmp_path)
    assert (tmp_path / "open" / "README.md").exists()
    r = git("clone", forge.clone_url("ana/closed"), str(tmp_path / "closed"), cwd=tmp_path, check=False)
    assert r.returncode != 0
    raw = httpx.get(f"{forge.url}/ana/closed.git/info/refs?service=git-upload-pack", timeout=60)
    assert raw.status_code == 401 and raw.headers["www-authenticate"].startswith("Basic")
    # anonymous push to a public repository: credentials are asked for
    raw = httpx.get(f"{forge.url}/ana/open.git/info/refs?service=git-receive-pack", timeout=60)
    assert raw.status_code == 401
    # a nonexistent repository looks exactly like a private one
    nothing = httpx.get(f"{forge.url}/ana/nothing.git/info/refs?service=git-upload-pack", timeout=60)
    assert nothing.status_code == 401


def test_shallow_clone_and_protocol_v2(forge: Forge, tmp_path: Path) -> None:
    ana = forge.token("ana", "repo:write")
    forge.api("POST", "/api/v1/user/repos", ana, json={"name": "hist", "auto_init": True})
    work = tmp_path / "w"
    git("clone", forge.clone_url("ana/hist", ana), str(work), cwd=tmp_path)
    for i in range(5):
        (work / "f").write_text(str(i))
        git("add", ".", cwd=work)
        git("commit", "-m", f"c{i}", cwd=work)
    git("push", "origin", "main", cwd=work)
    shallow = tmp_path / "shallow"
    git("clone", "--depth", "1", forge.clone_url("ana/hist", ana), str(shallow), cwd=tmp_path)
    assert git("rev-list", "--count", "HEAD", cwd=shallow).stdout.strip() == "1"
    v2 = git(
        "-c", "protocol.version=2", "ls-remote", forge.clone_url("ana/hist", ana), cwd=tmp_path,
        env={"GIT_TRACE_PACKET": "1"},
    )  # fmt: skip
    assert "version 2" in v2.stderr
    fetched = tmp_path / "v2"
    git("-c", "protocol.version=2", "clone", forge.clone_url("ana/hist", ana), str(fetched), cwd=tmp_path)
    assert git("rev-list", "--count", "HEAD", cwd=fetched).stdout.strip() == "6"


def test_archived_repository_refuses_pushes(forge: Forge, tmp_path: Path) -> None:
    ana = forge.token("ana", "repo:write")
    forge.api("POST", "/api/v1/user/repos", ana, json={"name": "old", "auto_init": True})
    work = tmp_path / "w"
    git("clone", forge.clone_url("ana/old", ana), str(work), cwd=tmp_path)
    assert forge.api("PATCH", "/api/v1/repos/ana/old", ana, json={"archived": True}).json()["archived"] is True
    (work / "z").write_text("z")
    git("add", ".", cwd=work)
    git("commit", "-m", "z", cwd=work)
    r = git("push", "origin", "main", cwd=work, check=False)
    assert r.returncode != 0 and "archived" in r.stderr
    # still readable
    git("fetch", "origin", cwd=work)
