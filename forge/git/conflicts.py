"""The conflicts of a merged index, one ``MergeConflictFile`` per file: its kind (content, add/add,
modify/delete, delete/modify, rename, other), the path on each side and whether a side is binary."""

from __future__ import annotations

import pygit2
from pygit2.enums import DiffFind, FileMode

from forge.git.schemas import ConflictKind, MergeConflictFile


def merged_conflicts(
    repo: pygit2.Repository,
    index: pygit2.Index,
    ancestor: pygit2.Commit,
    ours: pygit2.Commit,
    theirs: pygit2.Commit,
) -> list[MergeConflictFile]:
    """The conflicts of a merged index, one per file.

    The index holds up to three entries per path (ancestor, ours, theirs). A rename splits a
    conflict over several paths (the ancestor's entry at the old path, the renamed side's at the
    new one), so the renames of both sides are looked up and the pieces joined again.
    """
    conflicts = index.conflicts
    assert conflicts is not None
    triples = list(conflicts)
    our_renames: dict[str, str] = {}
    their_renames: dict[str, str] = {}
    if any(a is not None and (o is None or t is None) for a, o, t in triples):
        our_renames = _renames(ancestor.tree, ours.tree)
        their_renames = _renames(ancestor.tree, theirs.tree)

    # Entries on one side only, at a path a rename of that side leads to: they join the
    # conflict of the ancestor path they were renamed from.
    lone_ours = {o.path: o for a, o, t in triples if a is None and o is not None and t is None}
    lone_theirs = {t.path: t for a, o, t in triples if a is None and o is None and t is not None}
    joined: set[tuple[str, str]] = set()
    result: list[MergeConflictFile] = []
    for a, o, t in triples:
        if a is None:
            continue
        our_path = o.path if o is not None else our_renames.get(a.path)
        their_path = t.path if t is not None else their_renames.get(a.path)
        entries = [a, o, t]
        if o is None and our_path is not None and our_path in lone_ours:
            entries.append(lone_ours[our_path])
            joined.add(("ours", our_path))
        if t is None and their_path is not None and their_path in lone_theirs:
            entries.append(lone_theirs[their_path])
            joined.add(("theirs", their_path))
        result.append(_conflict_file(repo, a.path, our_path, their_path, entries, o is not None, t is not None))
    for a, o, t in triples:
        if a is not None:
            continue
        if o is not None and t is None and ("ours", o.path) in joined:
            continue
        if t is not None and o is None and ("theirs", t.path) in joined:
            continue
        result.append(
            _conflict_file(
                repo, None, o.path if o else None, t.path if t else None, [o, t], o is not None, t is not None
            )
        )
    return sorted(result, key=lambda c: c.path)


def _conflict_file(
    repo: pygit2.Repository,
    ancestor_path: str | None,
    our_path: str | None,
    their_path: str | None,
    entries: list[pygit2.IndexEntry | None],
    has_ours: bool,
    has_theirs: bool,
) -> MergeConflictFile:
    kind: ConflictKind
    if len({p for p in (ancestor_path, our_path, their_path) if p is not None}) > 1:
        kind = "rename"
    elif ancestor_path is not None and has_ours and has_theirs:
        kind = "content"
    elif ancestor_path is None and has_ours and has_theirs:
        kind = "add/add"
    elif ancestor_path is not None and has_ours:
        kind = "modify/delete"
    elif ancestor_path is not None and has_theirs:
        kind = "delete/modify"
    else:
        kind = "other"
    path = ancestor_path or our_path or their_path
    assert path is not None
    return MergeConflictFile(
        path=path,
        kind=kind,
        ancestor_path=ancestor_path,
        our_path=our_path,
        their_path=their_path,
        binary=any(_is_binary(repo, e) for e in entries if e is not None),
    )


def _renames(old: pygit2.Tree, new: pygit2.Tree) -> dict[str, str]:
    diff = old.diff_to_tree(new)
    diff.find_similar(DiffFind.FIND_RENAMES)
    return {d.old_file.path: d.new_file.path for d in diff.deltas if d.old_file.path != d.new_file.path}


def _is_binary(repo: pygit2.Repository, entry: pygit2.IndexEntry) -> bool:
    if entry.mode == FileMode.COMMIT:  # a submodule: the commit is not in this repository
        return False
    blob = repo.get(entry.id)
    return isinstance(blob, pygit2.Blob) and blob.is_binary
