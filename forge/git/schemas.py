"""The wire shapes of the git layer: msgspec structs returned by browse, compare and merge.

Schema evolution: new fields get defaults, a field never changes type.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

import msgspec

EntryType = Literal["blob", "tree", "commit", "symlink"]
FileStatus = Literal["added", "modified", "deleted", "renamed", "copied", "type_changed"]
DiffOrigin = Literal[" ", "+", "-"]
RefKind = Literal["branch", "tag", "commit"]
#: ``content``: both sides changed the file (text, binary, symlink target or mode);
#: ``add/add``: both added it; ``modify/delete``: the base branch changed it, the head deleted it;
#: ``delete/modify``: the other way round; ``rename``: a side renamed it (see the three paths);
#: ``other``: a conflict entry on one side only, such as a file where the other side has a directory.
ConflictKind = Literal["content", "add/add", "modify/delete", "delete/modify", "rename", "other"]


class Identity(msgspec.Struct, frozen=True, kw_only=True):
    """Who to write into a commit (author or committer)."""

    name: str
    email: str


class Signature(msgspec.Struct, frozen=True, kw_only=True):
    """An author, committer or tagger as recorded: ``time`` keeps the recorded UTC offset."""

    name: str
    email: str
    time: datetime


class CommitInfo(msgspec.Struct, frozen=True, kw_only=True):
    sha: str
    short_sha: str
    parents: list[str]
    author: Signature
    committer: Signature
    summary: str
    message: str


class CommitPage(msgspec.Struct, frozen=True, kw_only=True):
    commits: list[CommitInfo]
    page: int
    per_page: int
    has_next: bool


class BranchInfo(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    ref: str
    sha: str
    is_default: bool
    commit: CommitInfo | None = None


class TagInfo(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    ref: str
    #: The object the tag finally points at (peeled through annotated tags).
    sha: str
    target_type: Literal["commit", "tree", "blob", "tag"]
    annotated: bool
    #: The annotated tag object's id, if annotated.
    tag_sha: str | None = None
    message: str | None = None
    tagger: Signature | None = None
    commit: CommitInfo | None = None


class RefNames(msgspec.Struct, frozen=True, kw_only=True):
    """Branch names (the default first) and tag names: what a ref switcher lists."""

    branches: list[str]
    tags: list[str]


class ResolvedRef(msgspec.Struct, frozen=True, kw_only=True):
    """What a user-supplied ref or commit id resolved to."""

    sha: str
    kind: RefKind
    #: The full ref name when ``kind`` is ``branch`` or ``tag``.
    ref: str | None = None
    name: str | None = None


class TreeEntry(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    path: str
    type: EntryType
    #: Octal git file mode, as git prints it: ``"100644"``, ``"040000"`` ...
    mode: str
    sha: str
    #: Blob size in bytes; ``None`` for trees and submodules.
    size: int | None = None


class TreeListing(msgspec.Struct, frozen=True, kw_only=True):
    #: ``None`` (with no entries) for an empty repository.
    commit_sha: str | None
    path: str
    sha: str | None
    entries: list[TreeEntry]


class BlobInfo(msgspec.Struct, frozen=True, kw_only=True):
    path: str
    name: str
    sha: str
    size: int
    mode: str
    is_symlink: bool
    is_binary: bool
    #: Decoded text (UTF-8, invalid bytes replaced) when the blob is text and small enough.
    text: str | None
    #: The blob is larger than the text view limit: ``text`` is ``None``, use the raw download.
    truncated: bool
    commit_sha: str | None = None


class RawFile(msgspec.Struct, frozen=True, kw_only=True):
    """What the raw download needs: headers, and the bytes inline when the blob is small."""

    path: str
    sha: str
    size: int
    content_type: str
    headers: dict[str, str]
    #: ``None`` when the blob is above the inline limit: stream it with ``stream_blob``.
    data: bytes | None


class DiffLine(msgspec.Struct, frozen=True, kw_only=True):
    origin: DiffOrigin
    old_lineno: int | None
    new_lineno: int | None
    content: str
    #: This line is the last of its side and has no newline at its end.
    no_newline: bool = False


class Hunk(msgspec.Struct, frozen=True, kw_only=True):
    header: str
    old_start: int
    old_lines: int
    new_start: int
    new_lines: int
    lines: list[DiffLine]


class FileDiff(msgspec.Struct, frozen=True, kw_only=True):
    #: The path after the change (the old path for a deletion).
    path: str
    #: The path before the change; ``None`` for an added file.
    old_path: str | None
    status: FileStatus
    old_sha: str | None
    new_sha: str | None
    old_mode: str | None
    new_mode: str | None
    additions: int
    deletions: int
    is_binary: bool
    #: Hunks were not computed or not kept: the file or its diff passed a size limit.
    too_large: bool
    hunks: list[Hunk]
    similarity: int | None = None
    patch: str | None = None


class DiffStat(msgspec.Struct, frozen=True, kw_only=True):
    files: int
    additions: int
    deletions: int


class DiffResult(msgspec.Struct, frozen=True, kw_only=True):
    files: list[FileDiff]
    stats: DiffStat
    #: More files changed than the file limit: ``files`` holds the first ones, ``stats.files``
    #: counts all of them.
    files_truncated: bool


class Comparison(msgspec.Struct, frozen=True, kw_only=True):
    base: str
    head: str
    base_sha: str
    head_sha: str
    #: ``None`` when the two histories share no commit (then the diff is two-dot base..head).
    merge_base_sha: str | None
    ahead_by: int
    behind_by: int
    #: Commits in head and not in base, oldest first; the newest ``max_commits`` when truncated.
    commits: list[CommitInfo]
    commits_truncated: bool
    files: list[FileDiff]
    stats: DiffStat
    files_truncated: bool


class CommitDiff(msgspec.Struct, frozen=True, kw_only=True):
    commit: CommitInfo
    #: The first parent the diff is taken against; ``None`` for a root commit.
    parent_sha: str | None
    files: list[FileDiff]
    stats: DiffStat
    files_truncated: bool


class MergeConflictFile(msgspec.Struct, frozen=True, kw_only=True):
    """One conflicting file; the paths are ``None`` for a side the file does not exist on."""

    #: The common ancestor's path, else the base branch's, else the head's.
    path: str
    kind: ConflictKind
    ancestor_path: str | None
    our_path: str | None
    their_path: str | None
    #: A side is a binary file (git's rule: a NUL byte in the first 8000 bytes).
    binary: bool = False
