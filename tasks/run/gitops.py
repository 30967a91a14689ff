"""Workspace in, snapshot out: the host writes a commit's tree into the workspace and later reads
the work tree back into a commit, with pygit2 only. No git command ever runs in a directory the
agent can write, and the sandbox's `.git` (if it made one) is never read.

Blocking functions: call them through `RepoStore.read/write` (a worker thread)."""

__all__ = ["Checkout", "Skipped", "Snapshot", "SnapshotLimits", "SnapshotTooLarge"]  # and the functions below

import contextlib
from pathlib import Path

import msgspec
import pygit2

from forge.git.checkout import Checkout, Skipped, checkout
from forge.git.overlay import SnapshotLimits, SnapshotTooLarge
from forge.git.snapshot import Snapshot, snapshot
from sandbox.spec import SANDBOX_GID, SANDBOX_UID


def checkout_tree(repo: pygit2.Repository, sha: str, dest: Path) -> Checkout:
    """Write the tree of commit `sha` into the (fresh, empty) directory `dest`, owned by the
    sandbox's user; the manifest it returns goes back to `snapshot_commit`."""
    return checkout(repo, sha, dest, owner=(SANDBOX_UID, SANDBOX_GID))


# Commit the agent's accepted changes onto the task branch: `forge.git.snapshot.snapshot` (pass
# the `Checkout` that `checkout_tree` returned as `manifest`).
snapshot_commit = snapshot


def branch_sha(repo: pygit2.Repository, branch: str) -> str | None:
    ref = repo.references.get(f"refs/heads/{branch}")
    if ref is None:
        return None
    with contextlib.suppress(Exception):
        return str(repo[ref.target].peel(pygit2.Commit).id)
    return None


def manifest_path(workspace: Path) -> Path:
    """Where a workspace's checkout manifest lives: beside it, out of the agent's reach."""
    return workspace.with_name(workspace.name + ".manifest")


def save_manifest(workspace: Path, manifest: Checkout) -> None:
    """Persist the checkout manifest, so that recovery can snapshot the workspace of a run whose
    server died as the settle step would have (written whole, then renamed into place)."""
    target = manifest_path(workspace)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_bytes(msgspec.msgpack.encode(manifest))
    tmp.replace(target)


def load_manifest(workspace: Path) -> Checkout | None:
    """The saved manifest, or None (missing or unreadable: the snapshot then recomputes it)."""
    try:
        return msgspec.msgpack.decode(manifest_path(workspace).read_bytes(), type=Checkout)
    except (OSError, msgspec.DecodeError):
        return None


def first_file_at(
    repo: pygit2.Repository, sha: str, paths: tuple[str, ...], max_bytes: int
) -> tuple[str, bytes] | None:
    """The first of `paths` that is a file (blob) in commit `sha`, with its content (at most
    `max_bytes + 1` bytes read, so an oversized one is refused by its parser); None if none is."""
    tree = repo[sha].peel(pygit2.Commit).tree
    for path in paths:
        oid = _blob_at(tree, path)
        if oid is not None:
            blob = repo[oid]
            assert isinstance(blob, pygit2.Blob)
            return path, bytes(blob.data[: max_bytes + 1])
    return None


def blob_ids_at(repo: pygit2.Repository, sha: str, paths: tuple[str, ...]) -> dict[str, str]:
    """Each of `paths` in commit `sha`: its blob id (a content hash), or "" when no file is there."""
    tree = repo[sha].peel(pygit2.Commit).tree
    return {path: str(oid) if (oid := _blob_at(tree, path)) is not None else "" for path in paths}


def _blob_at(tree: pygit2.Tree, path: str) -> pygit2.Oid | None:
    try:
        entry = tree[path]
    except (KeyError, ValueError):
        return None
    return entry.id if entry.type_str == "blob" else None
