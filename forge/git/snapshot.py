"""Workspace in, snapshot out, with pygit2 and os only (no git command, no database).

`checkout` writes a commit's tree into a fresh directory and returns a manifest of what it wrote.
`snapshot` turns the work tree back into a commit **as an overlay on that base**: a path the
agent did not change keeps the base's exact entry (blob, mode, kind: executables, symlinks,
submodule links, big files), and a path the checkout did not write (a submodule link, a name the
host refused) is kept too, whatever the work tree holds there. Only the agent's changes are
judged; a change the rules refuse is listed in `skipped` and leaves the base's version (or
absence). A change set over the file-count or size cap raises `SnapshotTooLarge`; nothing is
ever cut silently.

The work tree is written by `forge.git.checkout` and read back by `forge.git.overlay`. Trees are
serialized here (not with libgit2's tree builder), so that base entries with names libgit2 would
refuse to insert are carried over byte for byte.

Blocking: call through `RepoStore.read/write` (a worker thread)."""

import os
from pathlib import Path

import msgspec
import pygit2
from pygit2.enums import ObjectType

from forge.git.bare import update_ref
from forge.git.checkout import TREE_MODE, Checkout, Entry, Skipped, expected_checkout
from forge.git.overlay import Overlay, SnapshotLimits
from forge.git.pathcheck import shown
from forge.git.schemas import Identity


class Snapshot(msgspec.Struct, frozen=True, kw_only=True):
    sha: str  # the new head (or the old one when nothing changed)
    committed: bool
    changed_files: list[str]
    skipped: list[Skipped]  # agent changes refused (the base's version was kept)


def _write_tree(repo: pygit2.Repository, entries: dict[bytes, Entry]) -> pygit2.Oid:
    def order(name: bytes) -> bytes:
        return name + b"/" if entries[name][0] == TREE_MODE else name

    raw = b"".join(b"%o %s\x00%s" % (entries[n][0], n, entries[n][1].raw) for n in sorted(entries, key=order))
    return repo.odb.write(ObjectType.TREE, raw)


def _apply(repo: pygit2.Repository, tree: pygit2.Tree | None, changes: dict[str, Entry | None]) -> pygit2.Oid | None:
    """`tree` with `changes` (relative paths) applied; untouched subtrees keep their ids. None: empty."""
    entries: dict[bytes, Entry] = {e.raw_name or b"": (e.filemode, e.id) for e in tree} if tree is not None else {}
    leaves: dict[str, Entry | None] = {}
    deeper: dict[str, dict[str, Entry | None]] = {}
    for path, change in changes.items():
        head, sep, rest = path.partition("/")
        if sep:
            deeper.setdefault(head, {})[rest] = change
        else:
            leaves[head] = change
    for name, change in leaves.items():
        if change is None:
            entries.pop(os.fsencode(name), None)
    for name, sub in deeper.items():
        key = os.fsencode(name)
        existing = entries.get(key)
        base = repo[existing[1]].peel(pygit2.Tree) if existing is not None and existing[0] == TREE_MODE else None
        new = _apply(repo, base, sub)
        if new is None:
            entries.pop(key, None)
        else:
            entries[key] = (TREE_MODE, new)
    for name, change in leaves.items():
        if change is not None:
            entries[os.fsencode(name)] = change
    return _write_tree(repo, entries) if entries else None


def snapshot(
    repo: pygit2.Repository,
    workspace: Path,
    *,
    branch: str,
    parent_sha: str,
    message: str,
    author: Identity,
    committer: Identity,
    limits: SnapshotLimits,
    manifest: Checkout | None = None,
    fence: str | None = None,
) -> Snapshot:
    """Commit the agent's accepted changes to the checkout of `parent_sha` (`manifest` is what
    `checkout` returned) onto `branch` (created at `parent_sha` if missing). Nothing changed (the
    tree is the start tree): no commit, and the branch is neither created nor moved. With `fence`
    (the run's id), the branch moves only while the run's fence is held (`forge.git.fences`)."""
    base_tree = repo[parent_sha].peel(pygit2.Commit).tree
    overlay = Overlay(repo, base_tree, manifest or expected_checkout(repo, parent_sha), limits)
    root = os.open(workspace, os.O_RDONLY | os.O_DIRECTORY)
    try:
        overlay.walk(root, "")
    finally:
        os.close(root)
    overlay.deletions()
    overlay.check_links()
    tree_id = _apply(repo, base_tree, overlay.changes) or _write_tree(repo, {})
    # Shown safely: a refused name that is not UTF-8 must not break the JSON of what reports it.
    skipped = [Skipped(path=shown(p), reason=r) for p, r in sorted(overlay.refused.items())]
    ref = f"refs/heads/{branch}"
    current = repo.references.get(ref)
    current_sha = str(current.target) if current is not None else None
    head_sha = current_sha or parent_sha
    parent = repo[head_sha].peel(pygit2.Commit)
    # Compared with the start tree, not the branch tip: a run that changed nothing must not
    # revert what reached the branch while it ran, nor leave an empty task branch behind.
    if tree_id in (base_tree.id, parent.tree.id):
        return Snapshot(sha=head_sha, committed=False, changed_files=[], skipped=skipped)
    diff = repo[tree_id].peel(pygit2.Tree).diff_to_tree(parent.tree, swap=True)
    changed = sorted({shown(d.new_file.path or d.old_file.path) for d in diff.deltas})
    author_sig = pygit2.Signature(author.name, author.email)
    committer_sig = pygit2.Signature(committer.name, committer.email)
    commit_id = repo.create_commit(None, author_sig, committer_sig, message, tree_id, [parent.id])
    update_ref(
        repo, ref, str(commit_id), expected_old=current_sha, message=f"snapshot: {message.splitlines()[0]}", fence=fence
    )
    return Snapshot(sha=str(commit_id), committed=True, changed_files=changed, skipped=skipped)
