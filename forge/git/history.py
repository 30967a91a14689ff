"""History for browsing: the last commit that touched each entry of a directory, and the history
of one path, both with a cap on how many commits they walk.

Synchronous functions on an open ``pygit2.Repository`` (run them through ``RepoStore.read``).
Both walk the history once, newest first by commit time, and stop at ``max_walk`` commits: a
repository with a million commits costs at most that many steps per page, and what was not
found by then is reported as unknown (``complete=False``) rather than searched for.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import islice
from typing import Final

import msgspec
import pygit2
from pygit2.enums import FileMode, SortMode

from forge.git.browse import MAX_PER_PAGE, commit_info, decode_text, start_commit
from forge.git.errors import PathNotFound
from forge.git.files import find_readme, list_tree
from forge.git.names import validate_tree_path
from forge.git.schemas import BlobInfo, CommitInfo, TreeListing

#: How many commits a tree page or a path history walks at most.
DEFAULT_MAX_WALK: Final = 5000


class LastCommits(msgspec.Struct, frozen=True, kw_only=True):
    """For each entry name of a directory, the newest commit that changed it."""

    commits: dict[str, CommitInfo]
    #: How many commits were walked.
    walked: int
    #: ``False`` when the walk stopped at its cap with entries still unresolved.
    complete: bool


class PathHistory(msgspec.Struct, frozen=True, kw_only=True):
    """One page of the commits that changed a path, newest first."""

    path: str
    commits: list[CommitInfo]
    page: int
    per_page: int
    has_next: bool
    #: The walk stopped at its cap: older commits may have touched the path too.
    truncated: bool
    walked: int


def _dir_id(tree: pygit2.Tree, path: str) -> pygit2.Oid | None:
    """The id of the directory at ``path`` (the tree itself for the root), ``None`` if absent or
    not a directory. Only ids are compared, so unchanged directories cost no object reads."""
    if not path:
        return tree.id
    try:
        entry = tree[path]
    except (KeyError, ValueError, pygit2.GitError):
        return None
    return entry.id if entry.filemode == FileMode.TREE else None


def _names(repo: pygit2.Repository, tree_id: pygit2.Oid) -> set[str]:
    return {decode_text(e.raw_name or b"") for e in repo[tree_id].peel(pygit2.Tree)}


#: Past this many unresolved names, one C-level tree diff beats a lookup per name.
_LOOKUP_LIMIT: Final = 48


class _Trees:
    """The directory trees of the walk, by id, kept for the next commit: in a linear history a
    commit's parent tree is the next commit's own, so each is read once."""

    def __init__(self, repo: pygit2.Repository) -> None:
        self.repo = repo
        self.cache: dict[pygit2.Oid, pygit2.Tree] = {}

    def get(self, oid: pygit2.Oid) -> pygit2.Tree:
        tree = self.cache.get(oid)
        if tree is None:
            if len(self.cache) >= 64:
                self.cache.clear()
            tree = self.cache[oid] = self.repo[oid].peel(pygit2.Tree)
        return tree

    def dir_id(self, root: pygit2.Oid, path: str) -> pygit2.Oid | None:
        """The id of directory ``path`` in the commit tree ``root`` (the root's own id for "")."""
        return root if not path else _dir_id(self.get(root), path)


def _entry_ids(tree: pygit2.Tree | None, names: set[str]) -> dict[str, pygit2.Oid | None]:
    if tree is None:
        return dict.fromkeys(names)
    return {name: _entry_id(tree, name) for name in names}


def _changed_names(trees: _Trees, old: pygit2.Oid | None, new: pygit2.Oid | None, pending: set[str]) -> set[str]:
    """Which of ``pending`` differ between two versions of a directory (either may be absent)."""
    if old is None and new is None:
        return set()
    old_tree = trees.get(old) if old is not None else None
    new_tree = trees.get(new) if new is not None else None
    if len(pending) <= _LOOKUP_LIMIT or old_tree is None or new_tree is None:
        before, after = _entry_ids(old_tree, pending), _entry_ids(new_tree, pending)
        return {name for name in pending if before[name] != after[name]}
    names: set[str] = set()
    for delta in old_tree.diff_to_tree(new_tree).deltas:  # skips identical subtrees, in C
        raw = delta.new_file.raw_path or delta.old_file.raw_path
        names.add(decode_text(raw.split(b"/", 1)[0]))
    return names & pending


def last_commits(
    repo: pygit2.Repository,
    ref: str | None,
    path: str,
    names: list[str],
    *,
    max_walk: int = DEFAULT_MAX_WALK,
) -> LastCommits:
    """The newest commit (by commit time) that changed each of ``names`` in directory ``path``.

    A commit changed an entry when the entry differs from every parent's (so a merge that took
    it unchanged from one side does not count, as in ``git log -- path``). One walk serves all
    names; it stops when every name is resolved or after ``max_walk`` commits.
    """
    norm = validate_tree_path(path) if path else ""
    start = start_commit(repo, ref)
    pending = set(names)
    found: dict[str, CommitInfo] = {}
    walked = 0
    if start is None or not pending:
        return LastCommits(commits=found, walked=0, complete=True)
    trees = _Trees(repo)
    for commit in repo.walk(start.id, SortMode.TIME):
        if walked >= max_walk:
            break
        walked += 1
        mine = trees.dir_id(commit.tree_id, norm)
        parent_ids = [trees.dir_id(p.tree_id, norm) for p in commit.parents]
        if mine is not None and mine in parent_ids:
            continue  # the directory is the same as in a parent: nothing here differs from all
        if not parent_ids:
            touched = _names(repo, mine) & pending if mine is not None else set()
        else:
            touched = set(pending)
            for parent in parent_ids:
                touched = _changed_names(trees, parent, mine, touched)
                if not touched:
                    break
        if touched:
            info = commit_info(commit)
            for name in touched:
                found[name] = info
            pending -= touched
            if not pending:
                break
    return LastCommits(commits=found, walked=walked, complete=not pending)


def _entry_id(tree: pygit2.Tree, path: str) -> pygit2.Oid | None:
    try:
        return tree[path].id
    except (KeyError, ValueError, pygit2.GitError):
        return None


def path_history(
    repo: pygit2.Repository,
    ref: str | None,
    path: str,
    *,
    page: int = 1,
    per_page: int = 30,
    max_walk: int = DEFAULT_MAX_WALK,
) -> PathHistory:
    """One page of the commits that changed ``path`` (a file or a directory), newest first,
    walking at most ``max_walk`` commits (``truncated`` says the walk stopped there)."""
    norm = validate_tree_path(path)
    page = max(1, int(page))
    per_page = max(1, min(int(per_page), MAX_PER_PAGE))
    start = start_commit(repo, ref)
    if start is None:
        return PathHistory(
            path=norm, commits=[], page=page, per_page=per_page, has_next=False, truncated=False, walked=0
        )
    if _entry_id(start.tree, norm) is None:
        raise PathNotFound(f"no such path: {norm}")
    walked = 0
    stopped = False

    def touching() -> Iterator[pygit2.Commit]:
        nonlocal walked, stopped
        for commit in repo.walk(start.id, SortMode.TIME):
            if walked >= max_walk:
                stopped = True
                return
            walked += 1
            mine = _entry_id(commit.tree, norm)
            if not commit.parents:
                if mine is not None:
                    yield commit
            elif all(_entry_id(p.tree, norm) != mine for p in commit.parents):
                yield commit

    window = list(islice(touching(), (page - 1) * per_page, page * per_page + 1))
    return PathHistory(
        path=norm,
        commits=[commit_info(c) for c in window[:per_page]],
        page=page,
        per_page=per_page,
        has_next=len(window) > per_page,
        truncated=stopped,
        walked=walked,
    )


class TreePage(msgspec.Struct, frozen=True, kw_only=True):
    """What a folder page shows: its entries, each entry's last commit, and its README."""

    listing: TreeListing
    last: LastCommits
    readme: BlobInfo | None


def tree_page(repo: pygit2.Repository, ref: str | None, path: str, *, max_walk: int = DEFAULT_MAX_WALK) -> TreePage:
    """A folder's listing, last commits and README in one call (one trip to the worker thread)."""
    listing = list_tree(repo, ref, path)
    at = listing.commit_sha
    if at is None:
        return TreePage(listing=listing, last=LastCommits(commits={}, walked=0, complete=True), readme=None)
    names = [e.name for e in listing.entries]
    last = last_commits(repo, at, listing.path, names, max_walk=max_walk)
    return TreePage(listing=listing, last=last, readme=find_readme(repo, at, path=listing.path))


def commits_between(repo: pygit2.Repository, base: str, head: str, *, max_commits: int = 250) -> list[tuple[str, str]]:
    """(sha, message) of the commits `head` has and `base` lacks, newest first, at most
    `max_commits` (what `#N` and `Fixes #N` in commit messages are read from). `base` may be a
    branch, a commit id, or zeros / "" for none. Unknown ids: none."""
    try:
        head_id = repo.revparse_single(head).peel(pygit2.Commit).id
        base_id = repo.revparse_single(base).peel(pygit2.Commit).id if base.strip("0") else None
    except (KeyError, ValueError, pygit2.GitError):
        return []
    walker = repo.walk(head_id, SortMode.TOPOLOGICAL | SortMode.TIME)
    if base_id is not None:
        walker.hide(base_id)
    return [(str(commit.id), commit.message) for commit in islice(walker, max_commits)]


def messages_between(repo: pygit2.Repository, base: str, head: str, *, max_commits: int = 250) -> list[str]:
    """The messages of `commits_between`."""
    return [message for _, message in commits_between(repo, base, head, max_commits=max_commits)]
