"""Runs' git fences (forge.git.fences) on real bare repositories: a held fence lets the run's
snapshot move the branch, a revoked one refuses it (the branch unchanged), a revocation waits for
the holder's transaction and removes only a very old lock, and fence refs are neither fetched nor
pushed to over smart HTTP with the real git client."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pygit2
import pytest

from forge.git import bare, fences, ref_locks
from forge.git.errors import Fenced, RefConflict
from forge.git.names import repo_path
from forge.git.refrules import PushContext
from forge.git.schemas import Identity
from tests.support.git import Client, serve

ALICE = Identity(name="Alice", email="alice@example.com")
RUN = "0b7c5d1e-5a7e-4c1b-9f6e-2d3c4b5a6f70"


@pytest.fixture
def repo(tmp_path: Path) -> pygit2.Repository:
    path = repo_path(tmp_path / "repos", "alice", "proj")
    bare.init_repo(path, readme_author=ALICE, description="demo")
    return pygit2.Repository(str(path))


def commit_on_main(repo: pygit2.Repository, text: str) -> str:
    main = repo.references["refs/heads/main"].target
    tree = repo.TreeBuilder()
    tree.insert("f.txt", repo.create_blob(text.encode()), pygit2.GIT_FILEMODE_BLOB)
    sig = pygit2.Signature("a", "a@example.com")
    return str(repo.create_commit(None, sig, sig, text, tree.write(), [main]))


def test_held_fence_lets_the_branch_move_and_a_revoked_one_refuses(repo: pygit2.Repository) -> None:
    start = str(repo.references["refs/heads/main"].target)
    fences.hold(repo, RUN)
    fences.hold(repo, RUN)  # its own worker again: still held
    assert fences.state(repo, RUN) == "held"
    first = commit_on_main(repo, "one")
    bare.update_ref(repo, "refs/heads/main", first, expected_old=start, fence=RUN)
    assert str(repo.references["refs/heads/main"].target) == first

    fences.revoke(repo, RUN)
    assert fences.state(repo, RUN) == "revoked"
    second = commit_on_main(repo, "two")
    with pytest.raises(Fenced):
        bare.update_ref(repo, "refs/heads/main", second, expected_old=first, fence=RUN)
    assert str(repo.references["refs/heads/main"].target) == first  # not moved
    assert not (Path(repo.path) / "refs/heads/main.lock").exists()  # and the locks let go
    assert not (Path(repo.path) / (fences.fence_ref(RUN) + ".lock")).exists()

    # A worker that reaches its hold after the takeover is refused too; the release keeps it.
    with pytest.raises(Fenced):
        fences.hold(repo, RUN)
    fences.release(repo, RUN)
    assert fences.state(repo, RUN) == "revoked"


def test_revoking_a_fence_never_held_and_releasing_a_held_one(repo: pygit2.Repository) -> None:
    fences.revoke(repo, RUN)  # the run's worker never got as far as its hold
    assert fences.state(repo, RUN) == "revoked"
    other = "1c8d6e2f-6b8f-4d2c-8a7f-3e4d5c6b7a81"
    fences.hold(repo, other)
    fences.release(repo, other)
    assert fences.state(repo, other) == "none"
    assert repo.references.get(fences.fence_ref(other)) is None


def test_revocation_waits_for_the_holders_transaction(repo: pygit2.Repository) -> None:
    fences.hold(repo, RUN)
    holder = pygit2.Repository(repo.path)
    locked, go = threading.Event(), threading.Event()

    def hold_lock() -> None:
        with holder.transaction() as txn:
            fences.check_held(holder, txn, RUN)
            locked.set()
            go.wait(10)

    thread = threading.Thread(target=hold_lock)
    thread.start()
    assert locked.wait(10)
    # While the holder's transaction has the fence, a short revocation gives up, changing nothing.
    with pytest.raises(RefConflict):
        fences.revoke(repo, RUN, lock_timeout=0.2)
    assert fences.state(repo, RUN) == "held"
    # A longer one waits for it and then revokes.
    releaser = threading.Timer(0.3, go.set)
    releaser.start()
    fences.revoke(repo, RUN, lock_timeout=10)
    thread.join(10)
    assert fences.state(repo, RUN) == "revoked"


def test_a_fence_lock_is_taken_for_a_dead_writers_only_when_very_old(repo: pygit2.Repository) -> None:
    fences.hold(repo, RUN)
    lock = Path(repo.path) / (fences.fence_ref(RUN) + ".lock")
    lock.write_text("")

    def aged(seconds: float) -> None:
        then = time.time() - seconds
        os.utime(lock, (then, then))

    # Older than git's 10 s but not than the fence's limit: perhaps a frozen holder. Left, and
    # neither the revocation nor the periodic sweep of ref locks removes it.
    aged(ref_locks.STALE_SECONDS + 20)
    with pytest.raises(RefConflict):
        fences.revoke(repo, RUN, lock_timeout=0.2)
    assert ref_locks.sweep(Path(repo.path).parents[1]) == []
    assert lock.exists() and fences.state(repo, RUN) == "held"
    # Past it: a dead writer's, removed, and the fence revoked.
    aged(fences.STALE_SECONDS + 5)
    fences.revoke(repo, RUN, lock_timeout=1)
    assert fences.state(repo, RUN) == "revoked" and not lock.exists()


def test_fence_ids_are_checked(repo: pygit2.Repository) -> None:
    for bad in ("", "../heads/main", "a/b", "x y"):
        with pytest.raises(ValueError):
            fences.fence_ref(bad)


async def test_fences_are_hidden_from_fetch_and_push(repo: pygit2.Repository, tmp_path: Path) -> None:
    fences.hold(repo, RUN)
    root = Path(repo.path).parents[1]
    client = Client(tmp_path / "client-home")
    async with serve(root, tmp_path) as server:
        server.contexts["alice/proj"] = PushContext(default_branch="main", is_admin=True)
        remote = f"{server.url}/alice/proj.git"
        listed = await client.run("ls-remote", remote, cwd=tmp_path)
        assert "refs/heads/main" in listed.output and "refs/forgehand" not in listed.output
        work = tmp_path / "work"
        await client.run("clone", "--mirror", remote, str(work), cwd=tmp_path)
        mirrored = await client.run("for-each-ref", cwd=work)
        assert "refs/forgehand" not in mirrored.output
        # Pushing to a fence, or deleting it, is refused (only branches and tags are pushed, and the
        # fences are hidden refs besides), and the fence stays held.
        pushed = await client.run("push", remote, f"refs/heads/main:{fences.fence_ref(RUN)}", cwd=work, check=False)
        assert pushed.returncode != 0 and "[remote rejected]" in pushed.output, pushed.output
        deleted = await client.run("push", remote, f":{fences.fence_ref(RUN)}", cwd=work, check=False)
        assert deleted.returncode != 0 and "[remote rejected]" in deleted.output, deleted.output
        # The same admin's push of a branch goes through: the refusal is the fence's, not the push's.
        await client.run("push", remote, "refs/heads/main:refs/heads/copy", cwd=work)
    assert fences.state(repo, RUN) == "held"
