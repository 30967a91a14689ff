"""Blame: which commit last changed each line of a file (pygit2's blame), with size caps.

Blame reads the file's whole history, so it is refused (``BlameRefused`` with a reason the page
shows) for binary files and for files above ``max_bytes`` or ``max_lines``; callers run it
through ``RepoStore.read``, off the event loop.
"""

from __future__ import annotations

from typing import Final, Literal

import msgspec
import pygit2

from forge.git.browse import commit_info, resolve_commit
from forge.git.files import blob_info
from forge.git.names import validate_tree_path
from forge.git.schemas import CommitInfo

DEFAULT_MAX_BYTES: Final = 256 * 1024
DEFAULT_MAX_LINES: Final = 5000

RefusalReason = Literal["binary", "too_large", "too_many_lines", "not_text"]


class BlameHunk(msgspec.Struct, frozen=True, kw_only=True):
    """Consecutive lines (1-based ``start``, ``count`` lines) last changed by ``commit``."""

    start: int
    count: int
    commit: CommitInfo
    #: The file's path in that commit, when it was renamed since.
    orig_path: str | None = None


class BlameInfo(msgspec.Struct, frozen=True, kw_only=True):
    path: str
    commit_sha: str
    size: int
    lines: list[str]
    hunks: list[BlameHunk]
    #: Set instead of ``hunks`` and ``lines`` when the file is not blamed, and why.
    refused: RefusalReason | None = None


def blame_file(
    repo: pygit2.Repository,
    ref: str | None,
    path: str,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_lines: int = DEFAULT_MAX_LINES,
) -> BlameInfo:
    """The blame of ``path`` at ``ref``; ``RefNotFound``/``PathNotFound``/``NotABlob`` for what
    does not exist, ``refused`` for what is too big or not text."""
    norm = validate_tree_path(path)
    commit = resolve_commit(repo, ref)
    info = blob_info(repo, commit.tree, norm, max_text_bytes=max_bytes, commit_sha=str(commit.id))

    def refused(reason: RefusalReason) -> BlameInfo:
        return BlameInfo(path=norm, commit_sha=str(commit.id), size=info.size, lines=[], hunks=[], refused=reason)

    if info.is_binary:
        return refused("binary")
    if info.truncated:
        return refused("too_large")
    if info.text is None:
        return refused("not_text")
    lines = info.text.splitlines()
    if len(lines) > max_lines:
        return refused("too_many_lines")
    blame = repo.blame(norm, newest_commit=commit.id)
    cache: dict[str, CommitInfo] = {}
    hunks: list[BlameHunk] = []
    for hunk in blame:
        sha = str(hunk.final_commit_id)
        found = cache.get(sha)
        if found is None:
            found = cache[sha] = commit_info(repo[hunk.final_commit_id].peel(pygit2.Commit))
        orig = hunk.orig_path
        hunks.append(
            BlameHunk(
                start=hunk.final_start_line_number,
                count=hunk.lines_in_hunk,
                commit=found,
                orig_path=orig if orig and orig != norm else None,
            )
        )
    return BlameInfo(path=norm, commit_sha=str(commit.id), size=info.size, lines=lines, hunks=hunks)
