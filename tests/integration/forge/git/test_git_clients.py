"""Git clients other than the git CLI clone, fetch and push: libgit2 (through pygit2) and dulwich, each
against a real forgehand server on 127.0.0.1. The git CLI is lenient where they are not (it took a
201 answer to git-upload-pack, for one), so each client is driven through the whole cycle."""

from pathlib import Path

import httpx
import pygit2
import pytest
from dulwich import porcelain
from dulwich.repo import Repo as DulwichRepo

from tests.support.accounts import LiveServer, make_account_with_token, run_sync

AUTHOR = pygit2.Signature("Ana", "ana@example.org")


class Forge:
    def __init__(self, server: LiveServer) -> None:
        self.server = server
        self.token = run_sync(make_account_with_token(server.settings, "ana", "repo:write"))
        r = httpx.post(
            f"{server.url}/api/v1/user/repos",
            headers={"Authorization": f"Bearer {self.token}"},
            json={"name": "demo", "auto_init": True},
            timeout=30,
        )
        assert r.status_code == 201, r.text
        self.url = f"{server.url}/ana/demo.git"

    def head(self, branch: str = "main") -> str:
        r = httpx.get(
            f"{self.server.url}/api/v1/repos/ana/demo/branches",
            headers={"Authorization": f"Bearer {self.token}"},
            timeout=30,
        )
        assert r.status_code == 200, r.text
        return next(str(b["sha"]) for b in r.json() if b["name"] == branch)


@pytest.fixture
def forge(live_server: LiveServer) -> Forge:
    return Forge(live_server)


def _commit_file(repo: pygit2.Repository, name: str, text: str) -> str:
    """A commit on HEAD's branch that adds `name` (written with pygit2 alone, no git CLI)."""
    (Path(repo.workdir) / name).write_text(text)
    repo.index.add(name)
    repo.index.write()
    tree = repo.index.write_tree()
    oid = repo.create_commit("HEAD", AUTHOR, AUTHOR, f"add {name}", tree, [repo.head.target])
    return str(oid)


def test_pygit2_clones_fetches_and_pushes(forge: Forge, tmp_path: Path) -> None:
    callbacks = pygit2.RemoteCallbacks(credentials=pygit2.UserPass("x", forge.token))
    first = pygit2.clone_repository(forge.url, str(tmp_path / "a"), callbacks=callbacks)
    assert (tmp_path / "a" / "README.md").exists()
    assert str(first.head.target) == forge.head()

    pushed = _commit_file(first, "from-libgit2.txt", "hello\n")
    first.remotes["origin"].push(["refs/heads/main:refs/heads/main"], callbacks=callbacks)
    assert forge.head() == pushed

    second = pygit2.clone_repository(forge.url, str(tmp_path / "b"), callbacks=callbacks)
    newer = _commit_file(second, "second.txt", "again\n")
    second.remotes["origin"].push(["refs/heads/main:refs/heads/topic"], callbacks=callbacks)
    assert forge.head("topic") == newer

    first.remotes["origin"].fetch(callbacks=callbacks)
    assert str(first.references["refs/remotes/origin/topic"].target) == newer


def test_pygit2_without_credentials_is_asked_for_them(forge: Forge, tmp_path: Path) -> None:
    asked: list[str] = []

    class Callbacks(pygit2.RemoteCallbacks):  # type: ignore[misc]
        def credentials(self, url: str, username_from_url: str | None, allowed_types: int) -> pygit2.UserPass:
            asked.append(url)
            return pygit2.UserPass("x", forge.token)

    pygit2.clone_repository(forge.url, str(tmp_path / "a"), callbacks=Callbacks())
    assert asked, "a private repository must answer 401 so that the client asks for credentials"


def test_dulwich_clones_fetches_and_pushes(forge: Forge, tmp_path: Path) -> None:
    auth = {"username": "x", "password": forge.token}
    porcelain.clone(forge.url, str(tmp_path / "a"), **auth)  # type: ignore[arg-type]
    assert (tmp_path / "a" / "README.md").exists()

    work = tmp_path / "a"
    (work / "from-dulwich.txt").write_text("hi\n")
    porcelain.add(str(work), [str(work / "from-dulwich.txt")])
    sha = porcelain.commit(str(work), message=b"add from dulwich", author=b"Ana <ana@example.org>").decode()
    porcelain.push(str(work), forge.url, "refs/heads/main", **auth)  # type: ignore[arg-type]
    assert forge.head() == sha

    other = tmp_path / "b"
    porcelain.clone(forge.url, str(other), **auth)  # type: ignore[arg-type]
    (other / "second.txt").write_text("2\n")
    porcelain.add(str(other), [str(other / "second.txt")])
    newer = porcelain.commit(str(other), message=b"second", author=b"Ana <ana@example.org>").decode()
    porcelain.push(str(other), forge.url, "refs/heads/main", **auth)  # type: ignore[arg-type]

    porcelain.fetch(str(work), forge.url, **auth)  # type: ignore[arg-type]
    with DulwichRepo(str(work)) as repo:
        assert newer.encode() in repo.object_store


@pytest.mark.parametrize("suffix", ["", "/"])
def test_clone_urls_without_dot_git_work_for_every_client(forge: Forge, tmp_path: Path, suffix: str) -> None:
    """GitHub and Gitea accept `https://host/owner/name` as a clone URL; so does forgehand."""
    import subprocess

    url = forge.url.removesuffix(".git") + suffix
    host_url = url.replace("http://", f"http://x:{forge.token}@")
    out = subprocess.run(
        ["git", "clone", "-q", host_url, str(tmp_path / "cli")],
        capture_output=True,
        text=True,
        timeout=120,
        env={"GIT_TERMINAL_PROMPT": "0", "HOME": str(tmp_path), "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "cli" / "README.md").exists()
    callbacks = pygit2.RemoteCallbacks(credentials=pygit2.UserPass("x", forge.token))
    pygit2.clone_repository(url, str(tmp_path / "libgit2"), callbacks=callbacks)
    assert (tmp_path / "libgit2" / "README.md").exists()
    porcelain.clone(url, str(tmp_path / "dulwich"), username="x", password=forge.token)
    assert (tmp_path / "dulwich" / "README.md").exists()
