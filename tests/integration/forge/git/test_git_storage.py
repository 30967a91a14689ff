"""Repository storage on real bare repositories and the real git CLI."""

import asyncio
import os
import subprocess
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pygit2
import pytest

from forge.git import bare
from forge.git.async_store import RepoStore
from forge.git.browse import list_branches, list_tags, log
from forge.git.errors import ImportFailed, RefConflict, RefNotFound, RepoExists, RepoNotFound
from forge.git.names import repo_path
from forge.git.schemas import Identity

ALICE = Identity(name="Alice", email="alice@example.com")


def git(*args: str, cwd: Path | None = None) -> str:
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(cwd or "/nonexistent"),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": "T",
        "GIT_AUTHOR_EMAIL": "t@example.com",
        "GIT_COMMITTER_NAME": "T",
        "GIT_COMMITTER_EMAIL": "t@example.com",
    }
    proc = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, check=True)
    return proc.stdout.decode()


def test_init_empty_repository(tmp_path: Path) -> None:
    path = repo_path(tmp_path, "alice", "empty")
    assert bare.init_repo(path, default_branch="trunk") is None
    repo = bare.open_repo(path)
    assert repo.is_bare and repo.head_is_unborn
    assert bare.default_branch(repo) == "trunk"
    config = repo.config
    assert config["receive.fsckObjects"] == "true"
    assert config["transfer.fsckObjects"] == "true"
    assert config["receive.denyNonFastForwards"] == "false"
    assert config["http.receivepack"] == "true"
    assert config["core.logAllRefUpdates"] == "true"
    assert list_branches(repo) == []
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".tmp-")]
    git("fsck", cwd=path)


def test_init_with_readme(tmp_path: Path) -> None:
    path = repo_path(tmp_path, "alice", "hello")
    sha = bare.init_repo(path, description="A demo", readme_author=ALICE, readme_title="hello")
    assert sha is not None
    repo = bare.open_repo(path)
    commit = repo.revparse_single("refs/heads/main")
    assert str(commit.id) == sha
    assert git("show", "main:README.md", cwd=path) == "# hello\n\nA demo\n"
    assert git("log", "--format=%an <%ae>", cwd=path).strip() == "Alice <alice@example.com>"


def test_init_refuses_existing(tmp_path: Path) -> None:
    path = repo_path(tmp_path, "alice", "x")
    bare.init_repo(path)
    with pytest.raises(RepoExists):
        bare.init_repo(path)


def test_write_commit_nested_paths_modes_and_deletes(tmp_path: Path) -> None:
    path = repo_path(tmp_path, "alice", "w")
    bare.init_repo(path)
    repo = bare.open_repo(path)
    when = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
    first = bare.write_commit(
        repo,
        branch="main",
        files={"a.txt": "a\n", "dir/sub/b.txt": b"b\n", "run.sh": "#!/bin/sh\n", "link": "a.txt"},
        modes={"run.sh": 0o100755, "link": 0o120000},
        message="first",
        author=ALICE,
        when=when,
        expected_old=None,
    )
    second = bare.write_commit(
        repo, branch="main", files={"dir/sub/b.txt": None, "dir/c.txt": "c"}, message="second", author=ALICE
    )
    assert git("rev-parse", "main~1", cwd=path).strip() == first
    assert git("rev-parse", "main", cwd=path).strip() == second
    tree = git("ls-tree", "-r", "main", cwd=path)
    assert "100755 blob" in tree and "run.sh" in tree
    assert "120000 blob" in tree
    assert "dir/sub/b.txt" not in tree and "dir/c.txt" in tree
    with pytest.raises(RefConflict):
        bare.write_commit(repo, branch="main", files={"x": "x"}, message="m", author=ALICE, expected_old=first)
    git("fsck", "--strict", cwd=path)


def test_update_ref_compare_and_swap(tmp_path: Path) -> None:
    path = repo_path(tmp_path, "alice", "cas")
    sha = bare.init_repo(path, readme_author=ALICE)
    assert sha is not None
    repo = bare.open_repo(path)
    bare.update_ref(repo, "refs/heads/copy", sha, expected_old=None)
    with pytest.raises(RefConflict):
        bare.update_ref(repo, "refs/heads/copy", sha, expected_old=None)
    bare.update_ref(repo, "refs/heads/copy", None, expected_old=sha)
    assert "refs/heads/copy" not in repo.references


def test_set_default_branch(tmp_path: Path) -> None:
    path = repo_path(tmp_path, "alice", "d")
    bare.init_repo(path)
    repo = bare.open_repo(path)
    bare.set_default_branch(repo, "develop")  # allowed on an empty repository
    assert bare.default_branch(repo) == "develop"
    bare.write_commit(repo, branch="develop", files={"f": "1"}, message="m", author=ALICE)
    with pytest.raises(RefNotFound):
        bare.set_default_branch(repo, "missing")
    bare.write_commit(repo, branch="other", files={"f": "2"}, message="m", author=ALICE)
    bare.set_default_branch(repo, "other")
    assert git("symbolic-ref", "HEAD", cwd=path).strip() == "refs/heads/other"


def test_rename_and_delete(tmp_path: Path) -> None:
    old = repo_path(tmp_path, "alice", "old")
    new = repo_path(tmp_path, "bob", "new")
    bare.init_repo(old, readme_author=ALICE)
    bare.rename_repo(old, new)
    assert not old.exists() and (new / "HEAD").is_file()
    assert not (tmp_path / "alice").exists()  # empty owner directory dropped
    other = repo_path(tmp_path, "bob", "other")
    bare.init_repo(other)
    with pytest.raises(RepoExists):
        bare.rename_repo(new, other)
    bare.delete_repo(new)
    assert not new.exists()
    assert not any((tmp_path / ".trash").iterdir())
    with pytest.raises(RepoNotFound):
        bare.delete_repo(new)


def _source_repo(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    git("init", "-q", "-b", "main", cwd=src)
    (src / "f.txt").write_text("one\n")
    git("add", ".", cwd=src)
    git("commit", "-qm", "one", cwd=src)
    git("tag", "-a", "v1", "-m", "version 1", cwd=src)
    git("checkout", "-qb", "feature", cwd=src)
    (src / "g.txt").write_text("two\n")
    git("add", ".", cwd=src)
    git("commit", "-qm", "two", cwd=src)
    git("tag", "light", cwd=src)
    git("checkout", "-q", "main", cwd=src)
    git("update-ref", "refs/remotes/origin/junk", "HEAD", cwd=src)
    git("update-ref", "refs/pull/1/head", "feature", cwd=src)
    return src


@pytest.mark.parametrize("as_url", [False, True])
def test_import_all_branches_and_tags(tmp_path: Path, as_url: bool) -> None:
    src = _source_repo(tmp_path)
    dest = repo_path(tmp_path / "repos", "alice", "imported")
    bare.import_repo(dest, f"file://{src}" if as_url else str(src))
    repo = bare.open_repo(dest)
    assert [b.name for b in list_branches(repo)] == ["main", "feature"]
    assert [t.name for t in list_tags(repo)] == ["light", "v1"]
    refs = git("for-each-ref", "--format=%(refname)", cwd=dest).split()
    assert not [r for r in refs if r.startswith(("refs/remotes/", "refs/pull/"))]
    assert "remote.origin.url" not in git("config", "--list", cwd=dest)
    assert repo.config["receive.fsckObjects"] == "true"
    assert not (dest / "objects" / "info" / "alternates").exists()
    assert log(repo, "feature").commits[0].summary == "two"


@pytest.mark.parametrize(
    "source", ["https://example.com/x.git", "ssh://host/x", "ext::sh -c touch% /tmp/pwned", "/nonexistent/x"]
)
def test_import_refuses_non_local_sources(tmp_path: Path, source: str) -> None:
    with pytest.raises(ImportFailed):
        bare.import_repo(repo_path(tmp_path, "alice", "x"), source)
    assert not Path("/tmp/pwned").exists()


def test_import_of_a_non_repository_fails_cleanly(tmp_path: Path) -> None:
    (tmp_path / "plain").mkdir()
    dest = repo_path(tmp_path / "repos", "alice", "x")
    with pytest.raises(ImportFailed):
        bare.import_repo(dest, str(tmp_path / "plain"))
    assert not dest.exists()
    assert not [p for p in dest.parent.iterdir() if p.name.startswith(".tmp-")]


def test_fsck_helper(tmp_path: Path) -> None:
    path = repo_path(tmp_path, "alice", "f")
    bare.init_repo(path, readme_author=ALICE)
    clean, _ = bare.fsck(path)
    assert clean


# --- RepoStore ------------------------------------------------------------------------------------


async def test_repo_store_read_write_and_lifecycle(tmp_path: Path) -> None:
    store = RepoStore(tmp_path)
    try:
        sha = await store.create(("alice", "proj"), readme_author=ALICE, description="d")
        assert sha is not None
        assert store.exists(("Alice", "PROJ"))
        branches = await store.read(("alice", "proj"), list_branches)
        assert [b.sha for b in branches] == [sha]

        async def commit(i: int) -> str:
            return await store.write(
                ("alice", "proj"),
                bare.write_commit,
                branch="main",
                files={f"f{i}.txt": str(i)},
                message=f"c{i}",
                author=ALICE,
            )

        # 20 concurrent writers: serialized, so no RefConflict and no lost commit.
        await asyncio.gather(*(commit(i) for i in range(20)))
        page = await store.read(("alice", "proj"), log, per_page=100)
        assert len(page.commits) == 21
        await store.rename(("alice", "proj"), ("alice", "renamed"))
        assert not store.exists(("alice", "proj")) and store.exists(("alice", "renamed"))
        await store.rename_owner("alice", "alicia")
        assert store.exists(("alicia", "renamed"))
        await store.delete(("alicia", "renamed"))
        assert not store.exists(("alicia", "renamed"))
        with pytest.raises(RepoNotFound):
            await store.read(("alicia", "renamed"), list_branches)
    finally:
        await store.close()


async def test_repo_store_import(tmp_path: Path) -> None:
    src = _source_repo(tmp_path)
    store = RepoStore(tmp_path / "repos")
    try:
        await store.import_from(("alice", "imp"), str(src))
        tags = await store.read(("alice", "imp"), list_tags)
        assert {t.name for t in tags} == {"v1", "light"}
    finally:
        await store.close()


def test_write_lock_is_per_repository(tmp_path: Path) -> None:
    store = RepoStore(tmp_path)
    assert store.lock(("a", "x")) is store.lock(("A", "X"))
    assert store.lock(("a", "x")) is not store.lock(("a", "y"))


def test_pygit2_signature_time_round_trip(tmp_path: Path) -> None:
    path = repo_path(tmp_path, "alice", "t")
    bare.init_repo(path)
    repo = bare.open_repo(path)
    when = datetime(2023, 1, 2, 3, 4, 5, tzinfo=timezone(timedelta(hours=-5)))
    bare.write_commit(repo, branch="main", files={"f": "x"}, message="m", author=ALICE, when=when)
    info = log(repo).commits[0]
    assert info.author.time == when
    assert info.author.time.utcoffset() == timedelta(hours=-5)
    assert isinstance(repo.revparse_single("main"), pygit2.Commit)
