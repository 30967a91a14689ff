"""Files in a repository: tree listings, blobs (text, binary, huge), README, raw downloads.

Synchronous functions on an open ``pygit2.Repository`` (run them through ``RepoStore.read``).
Blobs are never loaded to learn their size or type; a blob above the text limit is not loaded at
all (its first bytes are read with ``git cat-file`` to tell binary from text).
"""

from __future__ import annotations

import pygit2
from pygit2.enums import FileMode

from forge.git.browse import decode_text, resolve_commit, start_commit
from forge.git.errors import NotABlob, NotATree, PathNotFound
from forge.git.names import validate_tree_path
from forge.git.raw import (
    DEFAULT_INLINE_LIMIT,
    SNIFF_BYTES,
    TEXT_CONTENT_TYPE,
    is_binary_sample,
    peek_blob,
    raw_headers,
    safe_content_type,
)
from forge.git.schemas import BlobInfo, EntryType, RawFile, TreeEntry, TreeListing

DEFAULT_TEXT_LIMIT = 1024 * 1024

#: README file names at the root, best first (compared case-insensitively).
README_NAMES = (
    "readme.md",
    "readme.markdown",
    "readme.mdown",
    "readme.rst",
    "readme.txt",
    "readme",
    "readme.adoc",
    "readme.org",
)
MARKDOWN_SUFFIXES = (".md", ".markdown", ".mdown")


def _mode_str(mode: int) -> str:
    return f"{mode:06o}"


def _entry_type(mode: int) -> EntryType:
    if mode == FileMode.TREE:
        return "tree"
    if mode == FileMode.COMMIT:
        return "commit"
    if mode == FileMode.LINK:
        return "symlink"
    return "blob"


def _blob_size(repo: pygit2.Repository, oid: pygit2.Oid | str) -> int:
    """The size of a blob without loading it."""
    return repo.odb.read_header(oid)[1]


def _lookup(tree: pygit2.Tree, path: str) -> tuple[pygit2.Oid, int]:
    """The (id, mode) of the entry at ``path``; the object itself is not loaded."""
    try:
        entry = tree[path]
    except (KeyError, ValueError, pygit2.GitError) as exc:
        raise PathNotFound(f"no such path: {path}") from exc
    return entry.id, int(entry.filemode)


def list_tree(repo: pygit2.Repository, ref: str | None = None, path: str = "") -> TreeListing:
    """The entries of the directory ``path`` at ``ref``: directories first, then by name."""
    norm = validate_tree_path(path)
    commit = start_commit(repo, ref)
    if commit is None:
        if norm:
            raise PathNotFound("the repository is empty")
        return TreeListing(commit_sha=None, path="", sha=None, entries=[])
    tree = commit.tree
    if norm:
        oid, mode = _lookup(tree, norm)
        if mode != FileMode.TREE:
            raise NotATree(f"not a directory: {norm}")
        tree = repo[oid].peel(pygit2.Tree)
    entries: list[TreeEntry] = []
    for entry in tree:
        name = decode_text(entry.raw_name or b"")
        mode = int(entry.filemode)
        kind = _entry_type(mode)
        size = None
        if kind in ("blob", "symlink"):
            try:
                size = _blob_size(repo, entry.id)
            except (KeyError, pygit2.GitError):
                size = None
        entries.append(
            TreeEntry(
                name=name,
                path=f"{norm}/{name}" if norm else name,
                type=kind,
                mode=_mode_str(mode),
                sha=str(entry.id),
                size=size,
            )
        )
    entries.sort(key=lambda e: (e.type != "tree", e.name.lower(), e.name))
    return TreeListing(commit_sha=str(commit.id), path=norm, sha=str(tree.id), entries=entries)


def read_blob(
    repo: pygit2.Repository,
    ref: str | None,
    path: str,
    *,
    max_text_bytes: int = DEFAULT_TEXT_LIMIT,
) -> BlobInfo:
    """The file at ``path``: text when it is text and at most ``max_text_bytes`` long.

    A larger blob is not loaded (``truncated``, ``text`` is ``None``); its first bytes are read
    to tell binary from text. A symlink's text is its target.
    """
    norm = validate_tree_path(path)
    if not norm:
        raise NotABlob("the root is a directory")
    commit = start_commit(repo, ref)
    if commit is None:
        raise PathNotFound("the repository is empty")
    return blob_info(repo, commit.tree, norm, max_text_bytes=max_text_bytes, commit_sha=str(commit.id))


def blob_info(
    repo: pygit2.Repository,
    tree: pygit2.Tree,
    path: str,
    *,
    max_text_bytes: int = DEFAULT_TEXT_LIMIT,
    commit_sha: str | None = None,
) -> BlobInfo:
    oid, mode = _lookup(tree, path)
    if mode == FileMode.TREE:
        raise NotABlob(f"{path} is a directory")
    if mode == FileMode.COMMIT:
        raise NotABlob(f"{path} is a submodule")
    size = _blob_size(repo, oid)
    is_symlink = mode == FileMode.LINK
    text: str | None = None
    truncated = size > max_text_bytes
    if truncated:
        is_binary = is_binary_sample(peek_blob(repo, str(oid)))
    else:
        data = repo[oid].peel(pygit2.Blob).data
        is_binary = not is_symlink and is_binary_sample(data)
        if not is_binary:
            text = decode_text(data)
    return BlobInfo(
        path=path,
        name=path.rsplit("/", 1)[-1],
        sha=str(oid),
        size=size,
        mode=_mode_str(mode),
        is_symlink=is_symlink,
        is_binary=is_binary,
        text=text,
        truncated=truncated,
        commit_sha=commit_sha,
    )


def find_readme(
    repo: pygit2.Repository,
    ref: str | None = None,
    *,
    path: str = "",
    max_text_bytes: int = DEFAULT_TEXT_LIMIT,
) -> BlobInfo | None:
    """The README in directory ``path`` (the root by default) of ``ref`` (``README.md`` first,
    any case), or ``None``."""
    norm = validate_tree_path(path) if path else ""
    commit = start_commit(repo, ref)
    if commit is None:
        return None
    folder = commit.tree
    if norm:
        oid, mode = _lookup(commit.tree, norm)
        if mode != FileMode.TREE:
            return None
        folder = repo[oid].peel(pygit2.Tree)
    best: tuple[int, str] | None = None
    for entry in folder:
        if entry.filemode not in (FileMode.BLOB, FileMode.BLOB_EXECUTABLE):
            continue
        name = decode_text(entry.raw_name or b"")
        lowered = name.lower()
        if lowered in README_NAMES:
            rank = (README_NAMES.index(lowered), name)
            best = rank if best is None or rank < best else best
    if best is None:
        return None
    found = f"{norm}/{best[1]}" if norm else best[1]
    return blob_info(repo, commit.tree, found, max_text_bytes=max_text_bytes, commit_sha=str(commit.id))


def is_markdown(path: str) -> bool:
    return path.lower().endswith(MARKDOWN_SUFFIXES)


def raw_file(
    repo: pygit2.Repository,
    ref: str | None,
    path: str,
    *,
    inline_limit: int = DEFAULT_INLINE_LIMIT,
) -> RawFile:
    """Everything the raw download needs. Blobs above ``inline_limit`` come without ``data``:
    stream them with ``stream_blob(repo_path, raw.sha)``."""
    commit = resolve_commit(repo, ref)
    info = blob_info(repo, commit.tree, path, max_text_bytes=0, commit_sha=str(commit.id))
    data: bytes | None = None
    if info.size <= inline_limit:
        data = repo[info.sha].peel(pygit2.Blob).data
        sample = data[:SNIFF_BYTES]
    else:
        sample = peek_blob(repo, info.sha)
    content_type = TEXT_CONTENT_TYPE if info.is_symlink else safe_content_type(sample)
    return RawFile(
        path=info.path,
        sha=info.sha,
        size=info.size,
        content_type=content_type,
        headers=raw_headers(info.name, content_type),
        data=data,
    )
