"""Diffs as structured data: compare ``base...head`` and a commit against its first parent.

The ``FileDiff``/``Hunk``/``DiffLine`` shapes are what reviews anchor inline comments on
(path, side, line number), so they are the same everywhere.

Huge input is handled by limits (``DiffLimits``): a file above ``max_file_bytes`` is not diffed
at all, a file diff above ``max_file_lines`` changed lines keeps its counts but no hunks, the
whole diff stops keeping hunks past ``max_total_lines``, and files past ``max_files`` are left
out (``files_truncated``). Such files say ``too_large``.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from pathlib import Path
from typing import Final

import msgspec
import pygit2
from pygit2.enums import DeltaStatus, DiffFind, DiffOption, FileMode, SortMode

from forge.git.browse import commit_info, decode_text, resolve_commit
from forge.git.raw import is_binary_sample, peek_blob
from forge.git.schemas import (
    CommitDiff,
    CommitInfo,
    Comparison,
    DiffLine,
    DiffOrigin,
    DiffResult,
    DiffStat,
    FileDiff,
    FileStatus,
    Hunk,
)

DEFAULT_MAX_COMMITS: Final = 250
_ZERO_OIDS = frozenset({"0" * 40, "0" * 64})

_STATUS: dict[DeltaStatus, FileStatus] = {
    DeltaStatus.ADDED: "added",
    DeltaStatus.DELETED: "deleted",
    DeltaStatus.MODIFIED: "modified",
    DeltaStatus.RENAMED: "renamed",
    DeltaStatus.COPIED: "copied",
    DeltaStatus.TYPECHANGE: "type_changed",
}


class DiffLimits(msgspec.Struct, frozen=True, kw_only=True):
    max_file_bytes: int = 1024 * 1024
    max_file_lines: int = 3000
    max_total_lines: int = 50_000
    max_files: int = 1000
    context_lines: int = 3
    find_renames: bool = True
    find_copies: bool = False
    rename_limit: int = 1000
    include_patch: bool = False


DEFAULT_LIMITS: Final = DiffLimits()


def _oid_or_none(oid: pygit2.Oid) -> str | None:
    sha = str(oid)
    return None if sha in _ZERO_OIDS else sha


def _mode_or_none(mode: int) -> str | None:
    return f"{int(mode):06o}" if mode else None


def _size(repo: pygit2.Repository, sha: str | None, mode: int) -> int:
    if sha is None or mode == FileMode.COMMIT:
        return 0
    try:
        return repo.odb.read_header(sha)[1]
    except (KeyError, ValueError, pygit2.GitError):
        return 0


def _mark_no_newline(lines: list[DiffLine], origin: str) -> None:
    wanted = {"=": (" ",), ">": ("-", " "), "<": ("+", " ")}[origin]
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].origin in wanted:
            lines[i] = msgspec.structs.replace(lines[i], no_newline=True)
            return


def _hunks(patch: pygit2.Patch) -> list[Hunk]:
    hunks: list[Hunk] = []
    for hunk in patch.hunks:
        lines: list[DiffLine] = []
        for line in hunk.lines:
            origin = line.origin
            if origin in ("=", ">", "<"):
                _mark_no_newline(lines, origin)
                continue
            if origin not in (" ", "+", "-"):
                continue
            content = decode_text(line.raw_content)
            if content.endswith("\n"):
                content = content[:-1]
            lines.append(
                DiffLine(
                    origin=_as_origin(origin),
                    old_lineno=line.old_lineno if line.old_lineno >= 0 else None,
                    new_lineno=line.new_lineno if line.new_lineno >= 0 else None,
                    content=content,
                )
            )
        hunks.append(
            Hunk(
                header=hunk.header.rstrip("\n"),
                old_start=hunk.old_start,
                old_lines=hunk.old_lines,
                new_start=hunk.new_start,
                new_lines=hunk.new_lines,
                lines=lines,
            )
        )
    return hunks


def _as_origin(origin: str) -> DiffOrigin:
    if origin == "+":
        return "+"
    if origin == "-":
        return "-"
    return " "


def _tree_diff(old: pygit2.Tree | None, new: pygit2.Tree | None, limits: DiffLimits) -> pygit2.Diff | None:
    ctx = limits.context_lines
    opts = DiffOption.INCLUDE_TYPECHANGE
    if old is not None and new is not None:
        diff = old.diff_to_tree(new, flags=opts, context_lines=ctx, interhunk_lines=0)
    elif new is not None:
        diff = new.diff_to_tree(flags=opts, context_lines=ctx, interhunk_lines=0, swap=True)
    elif old is not None:
        diff = old.diff_to_tree(flags=opts, context_lines=ctx, interhunk_lines=0)
    else:
        return None
    flags = DiffFind(0)
    if limits.find_renames:
        flags |= DiffFind.FIND_RENAMES
    if limits.find_copies:
        flags |= DiffFind.FIND_COPIES
    if flags:
        diff.find_similar(flags=flags, rename_limit=limits.rename_limit)
    return diff


def diff_trees(
    repo: pygit2.Repository,
    old: pygit2.Tree | None,
    new: pygit2.Tree | None,
    limits: DiffLimits = DEFAULT_LIMITS,
) -> DiffResult:
    """The structured diff from tree ``old`` to tree ``new`` (``None``: the empty tree)."""
    diff = _tree_diff(old, new, limits)
    if diff is None:
        return DiffResult(files=[], stats=DiffStat(files=0, additions=0, deletions=0), files_truncated=False)
    files: list[FileDiff] = []
    total_lines = additions = deletions = 0
    counted = 0
    for index, delta in enumerate(list(diff.deltas)):
        status = _STATUS.get(delta.status)
        if status is None:
            continue
        counted += 1
        if len(files) >= limits.max_files:
            continue
        file, lines = _file_diff(repo, diff, index, delta, status, limits, total_lines)
        total_lines += lines
        additions += file.additions
        deletions += file.deletions
        files.append(file)
    return DiffResult(
        files=files,
        stats=DiffStat(files=counted, additions=additions, deletions=deletions),
        files_truncated=counted > len(files),
    )


def _file_diff(
    repo: pygit2.Repository,
    diff: pygit2.Diff,
    index: int,
    delta: pygit2.DiffDelta,
    status: FileStatus,
    limits: DiffLimits,
    total_lines: int,
) -> tuple[FileDiff, int]:
    """One file of ``diff`` and the lines its hunks add to the total (``total_lines`` so far:
    past ``max_total_lines`` a file is ``too_large``, as one past ``max_file_lines`` or
    ``max_file_bytes`` is)."""
    old_sha = _oid_or_none(delta.old_file.id) if status != "added" else None
    new_sha = _oid_or_none(delta.new_file.id) if status != "deleted" else None
    old_mode, new_mode = int(delta.old_file.mode), int(delta.new_file.mode)
    size = max(_size(repo, old_sha, old_mode), _size(repo, new_sha, new_mode))
    hunks: list[Hunk] = []
    adds = dels = lines = 0
    patch_text: str | None = None
    if size > limits.max_file_bytes:
        too_large = True
        sample_sha = new_sha or old_sha
        is_binary = sample_sha is not None and is_binary_sample(peek_blob(repo, sample_sha))
    else:
        patch = diff[index]
        is_binary = bool(patch is not None and patch.delta.is_binary)
        too_large = False
        if patch is not None and not is_binary:
            _context, adds, dels = patch.line_stats
            changed = adds + dels
            if changed > limits.max_file_lines or total_lines + changed > limits.max_total_lines:
                too_large = True
            else:
                hunks = _hunks(patch)
                lines = changed
                if limits.include_patch:
                    patch_text = decode_text(patch.data)
    file = FileDiff(
        path=delta.new_file.path if status != "deleted" else delta.old_file.path,
        old_path=delta.old_file.path if status != "added" else None,
        status=status,
        old_sha=old_sha,
        new_sha=new_sha,
        old_mode=_mode_or_none(old_mode) if status != "added" else None,
        new_mode=_mode_or_none(new_mode) if status != "deleted" else None,
        additions=adds,
        deletions=dels,
        is_binary=is_binary,
        too_large=too_large,
        hunks=hunks,
        similarity=delta.similarity if status in ("renamed", "copied") else None,
        patch=patch_text,
    )
    return file, lines


def _ahead(
    repo: pygit2.Repository, base: pygit2.Commit, head: pygit2.Commit, max_commits: int
) -> tuple[list[CommitInfo], bool]:
    """The newest `max_commits` commits of head that base lacks, oldest first, and whether there
    were more."""
    walker = repo.walk(head.id, SortMode.TOPOLOGICAL | SortMode.TIME)
    walker.hide(base.id)
    newest: list[CommitInfo] = []
    for commit in walker:
        if len(newest) >= max_commits:
            return newest[::-1], True
        newest.append(commit_info(commit))
    return newest[::-1], False


def commits_ahead(
    repo: pygit2.Repository, base: str, head: str, *, max_commits: int = DEFAULT_MAX_COMMITS
) -> list[CommitInfo]:
    """The commits of ``base...head`` as `compare` lists them (oldest first, the newest
    ``max_commits``), without the diff. Kept for the same two commits (`_AheadCache`): the
    topological walk visits every commit ahead before the first comes out, and each page of a
    pull request's commits asks again."""
    base_commit, head_commit = resolve_commit(repo, base), resolve_commit(repo, head)
    key = (str(Path(repo.path).resolve()), str(base_commit.id), str(head_commit.id), max_commits)
    shas = _AHEAD.get(key)
    if shas is None:
        found, _ = _ahead(repo, base_commit, head_commit, max_commits)
        _AHEAD.put(key, tuple(c.sha for c in found))
        return found
    return [commit_info(repo[sha].peel(pygit2.Commit)) for sha in shas]


class _AheadCache:
    """The last few `commits_ahead` answers, as commit ids (their details are read again, cheaply:
    a message may be large). Commits are named by their content, so an answer for two commit ids
    never goes stale; the repository's path is in the key because ids are only unique within one
    object store. Shared by the git threads, hence the lock."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._items: OrderedDict[tuple[str, str, str, int], tuple[str, ...]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple[str, str, str, int]) -> tuple[str, ...] | None:
        with self._lock:
            found = self._items.get(key)
            if found is not None:
                self._items.move_to_end(key)
            return found

    def put(self, key: tuple[str, str, str, int], value: tuple[str, ...]) -> None:
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self._size:
                self._items.popitem(last=False)


_AHEAD = _AheadCache(64)


def compare(
    repo: pygit2.Repository,
    base: str,
    head: str,
    *,
    max_commits: int = DEFAULT_MAX_COMMITS,
    limits: DiffLimits = DEFAULT_LIMITS,
) -> Comparison:
    """``base...head``: the commits of head that base lacks, and the diff from their merge base
    to head. ``base`` and ``head`` are refs or commit ids (``RefNotFound`` otherwise)."""
    base_commit = resolve_commit(repo, base)
    head_commit = resolve_commit(repo, head)
    merge_base = repo.merge_base(base_commit.id, head_commit.id)
    ahead, behind = repo.ahead_behind(head_commit.id, base_commit.id)
    newest, truncated = _ahead(repo, base_commit, head_commit, max_commits)
    old_tree = repo[merge_base].peel(pygit2.Tree) if merge_base is not None else base_commit.tree
    result = diff_trees(repo, old_tree, head_commit.tree, limits)
    return Comparison(
        base=base,
        head=head,
        base_sha=str(base_commit.id),
        head_sha=str(head_commit.id),
        merge_base_sha=str(merge_base) if merge_base is not None else None,
        ahead_by=ahead,
        behind_by=behind,
        commits=newest,
        commits_truncated=truncated,
        files=result.files,
        stats=result.stats,
        files_truncated=result.files_truncated,
    )


def commit_diff(repo: pygit2.Repository, spec: str, *, limits: DiffLimits = DEFAULT_LIMITS) -> CommitDiff:
    """A commit and its diff against its first parent (against nothing for a root commit)."""
    commit = resolve_commit(repo, spec)
    parent = commit.parents[0] if commit.parent_ids else None
    result = diff_trees(repo, parent.tree if parent is not None else None, commit.tree, limits)
    return CommitDiff(
        commit=commit_info(commit),
        parent_sha=str(parent.id) if parent is not None else None,
        files=result.files,
        stats=result.stats,
        files_truncated=result.files_truncated,
    )


class Divergence(msgspec.Struct, frozen=True, kw_only=True):
    """Two branches as a pull request sees them: their tips (None: no such branch) and how far
    the head is ahead of and behind the base."""

    base_sha: str | None
    head_sha: str | None
    ahead_by: int = 0
    behind_by: int = 0


def divergence(repo: pygit2.Repository, base_branch: str, head_branch: str) -> Divergence:
    """The tips of ``base_branch`` and ``head_branch`` and, when both exist, their distance."""
    tips = []
    for branch in (base_branch, head_branch):
        ref = repo.references.get(f"refs/heads/{branch}")
        target = ref.resolve().target if ref is not None else None
        tips.append(target if isinstance(target, pygit2.Oid) else None)
    base, head = tips
    if base is None or head is None:
        return Divergence(base_sha=str(base) if base else None, head_sha=str(head) if head else None)
    ahead, behind = repo.ahead_behind(head, base)
    return Divergence(base_sha=str(base), head_sha=str(head), ahead_by=ahead, behind_by=behind)


def changed_paths(repo: pygit2.Repository, base: str, head: str) -> list[str]:
    """The paths ``base...head`` changes (both names of a rename), without the patches."""
    base_commit = resolve_commit(repo, base)
    head_commit = resolve_commit(repo, head)
    merge_base = repo.merge_base(base_commit.id, head_commit.id)
    old_tree = repo[merge_base].peel(pygit2.Tree) if merge_base is not None else base_commit.tree
    diff = old_tree.diff_to_tree(head_commit.tree, flags=DiffOption.INCLUDE_TYPECHANGE)
    diff.find_similar(flags=DiffFind.FIND_RENAMES)
    paths: set[str] = set()
    for delta in diff.deltas:
        paths.update(p for p in (delta.old_file.path, delta.new_file.path) if p)
    return sorted(paths)
