"""A snapshot of an untouched workspace: no commit, and the task branch is neither created nor
moved, even when the branch moved on while the run worked (nothing of that is reverted)."""

from pathlib import Path

import pygit2

from forge.git.checkout import Checkout, checkout
from forge.git.overlay import SnapshotLimits
from forge.git.schemas import Identity
from forge.git.snapshot import snapshot
from tests.support.git import BLOB, commit_tree

ANA = Identity(name="Ana", email="ana@example.com")


def _snap(repo: pygit2.Repository, ws: Path, base: str, manifest: Checkout) -> tuple[str, bool]:
    snap = snapshot(
        repo,
        ws,
        branch="agent/1",
        parent_sha=base,
        message="m",
        author=ANA,
        committer=ANA,
        limits=SnapshotLimits(),
        manifest=manifest,
    )
    return snap.sha, snap.committed


def _untouched(tmp_path: Path) -> tuple[pygit2.Repository, str, Path, Checkout]:
    """A repository with one commit, and its checkout (which the test then leaves alone)."""
    repo = pygit2.init_repository(str(tmp_path / "r.git"), bare=True)
    base = commit_tree(repo, {"a.txt": (BLOB, b"a\n")})
    ws = tmp_path / "ws"
    ws.mkdir()
    return repo, base, ws, checkout(repo, base, ws)


def test_an_untouched_workspace_creates_no_task_branch(tmp_path: Path) -> None:
    repo, base, ws, manifest = _untouched(tmp_path)
    assert _snap(repo, ws, base, manifest) == (base, False)
    assert repo.references.get("refs/heads/agent/1") is None


def test_an_untouched_workspace_does_not_revert_what_reached_the_branch_meanwhile(tmp_path: Path) -> None:
    repo, base, ws, manifest = _untouched(tmp_path)
    # Someone pushes to the task branch while the run works.
    sig = pygit2.Signature("Bo", "bo@example.com")
    tree = repo.TreeBuilder(repo[base].peel(pygit2.Commit).tree)
    tree.insert("b.txt", repo.create_blob(b"b\n"), pygit2.enums.FileMode.BLOB)
    pushed = str(repo.create_commit("refs/heads/agent/1", sig, sig, "push", tree.write(), [pygit2.Oid(hex=base)]))
    assert _snap(repo, ws, base, manifest) == (pushed, False)
    assert str(repo.references["refs/heads/agent/1"].target) == pushed
