"""Reading a repository: refs, commit log, commits, trees, blobs, README.

Every function takes an open ``pygit2.Repository`` and is synchronous (run it through
``RepoStore.read``). An empty repository is not an error: lists are empty, the tree listing has
no entries, there is no README.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, timezone
from itertools import islice

import pygit2
from pygit2.enums import FileMode, SortMode

from forge.repos.errors import NotABlob, NotATree, PathNotFound, RefNotFound
from forge.repos.names import REF_MAX_LENGTH, validate_tree_path
from forge.repos.raw import (
    DEFAULT_INLINE_LIMIT,
    SNIFF_BYTES,
    TEXT_CONTENT_TYPE,
    is_binary_sample,
    peek_blob,
    raw_headers,
    safe_content_type,
)
from forge.repos.schemas import (
    BlobInfo,
    BranchInfo,
    CommitInfo,
    CommitPage,
    EntryType,
    RawFile,
    ResolvedRef,
    Signature,
    TagInfo,
    TreeEntry,
    TreeListing,
)
from forge.repos.storage import default_branch

MAX_PER_PAGE = 100
DEFAULT_TEXT_LIMIT = 1024 * 1024
MIN_ABBREV = 7
_HEX_RE = re.compile(r"[0-9a-fA-F]{7,64}", re.ASCII)

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


# --- conversions ----------------------------------------------------------------------------------


def decode_text(data: bytes, encoding: str | None = None) -> str:
    try:
        return data.decode(encoding or "utf-8", errors="replace")
    except LookupError:  # an unknown encoding named in the commit header
        return data.decode("utf-8", errors="replace")


def signature_info(sig: pygit2.Signature) -> Signature:
    try:
        tz = timezone(timedelta(minutes=sig.offset))
    except ValueError:
        tz = UTC
    try:
        when = datetime.fromtimestamp(sig.time, tz=tz)
    except (OverflowError, OSError, ValueError):
        when = datetime.fromtimestamp(0, tz=UTC)
    return Signature(name=decode_text(sig.raw_name), email=decode_text(sig.raw_email), time=when)


def commit_info(commit: pygit2.Commit) -> CommitInfo:
    message = decode_text(commit.raw_message, commit.message_encoding)
    summary = message.strip().split("\n", 1)[0].strip() if message.strip() else ""
    sha = str(commit.id)
    return CommitInfo(
        sha=sha,
        short_sha=sha[:MIN_ABBREV],
        parents=[str(p) for p in commit.parent_ids],
        author=signature_info(commit.author),
        committer=signature_info(commit.committer),
        summary=summary,
        message=message,
    )


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


# --- refs -----------------------------------------------------------------------------------------


def _ref_names(repo: pygit2.Repository, prefix: str) -> list[str]:
    names: list[str] = []
    for raw in repo.raw_listall_references():
        try:
            name = raw.decode("utf-8")
        except UnicodeDecodeError:
            continue
        if name.startswith(prefix):
            names.append(name)
    return sorted(names)


def _peel_commit(obj: pygit2.Object) -> pygit2.Commit | None:
    try:
        return obj.peel(pygit2.Commit)
    except (pygit2.InvalidSpecError, pygit2.GitError, ValueError, KeyError):
        return None


def _ref_commit(repo: pygit2.Repository, ref: str) -> pygit2.Commit | None:
    reference = repo.references.get(ref)
    if reference is None:
        return None
    try:
        target = reference.resolve().target
    except (KeyError, pygit2.GitError):
        return None
    obj = repo.get(target)
    return _peel_commit(obj) if obj is not None else None


def list_branches(repo: pygit2.Repository, *, with_commits: bool = True) -> list[BranchInfo]:
    """All branches, the default branch first, then by name."""
    default = default_branch(repo)
    branches: list[BranchInfo] = []
    for ref in _ref_names(repo, "refs/heads/"):
        commit = _ref_commit(repo, ref)
        if commit is None:
            continue
        name = ref.removeprefix("refs/heads/")
        branches.append(
            BranchInfo(
                name=name,
                ref=ref,
                sha=str(commit.id),
                is_default=name == default,
                commit=commit_info(commit) if with_commits else None,
            )
        )
    branches.sort(key=lambda b: (not b.is_default, b.name))
    return branches


def list_tags(repo: pygit2.Repository) -> list[TagInfo]:
    """All tags by name; annotated tags are peeled, ``commit`` is set when they reach one."""
    tags: list[TagInfo] = []
    for ref in _ref_names(repo, "refs/tags/"):
        reference = repo.references.get(ref)
        if reference is None:
            continue
        try:
            obj = repo.get(reference.resolve().target)
        except (KeyError, pygit2.GitError):
            continue
        if obj is None:
            continue
        annotated = isinstance(obj, pygit2.Tag)
        tag_sha = str(obj.id) if annotated else None
        message = tagger = None
        if isinstance(obj, pygit2.Tag):
            message = decode_text(obj.raw_message)
            try:
                tagger = signature_info(obj.tagger) if obj.tagger is not None else None
            except (ValueError, pygit2.GitError):
                tagger = None
            try:
                target: pygit2.Object | pygit2.Commit | pygit2.Tree | pygit2.Tag | pygit2.Blob
                target = obj.peel(None)
            except (pygit2.GitError, ValueError, KeyError):
                continue
        else:
            target = obj
        commit = target if isinstance(target, pygit2.Commit) else None
        tags.append(
            TagInfo(
                name=ref.removeprefix("refs/tags/"),
                ref=ref,
                sha=str(target.id),
                target_type=target.type_str,
                annotated=annotated,
                tag_sha=tag_sha,
                message=message,
                tagger=tagger,
                commit=commit_info(commit) if commit is not None else None,
            )
        )
    return tags


def head_commit(repo: pygit2.Repository) -> pygit2.Commit | None:
    """The commit of the default branch, ``None`` if the repository (or that branch) is empty."""
    branch = default_branch(repo)
    if branch is None:
        try:
            return _peel_commit(repo.revparse_single("HEAD"))
        except (KeyError, pygit2.GitError):
            return None
    return _ref_commit(repo, f"refs/heads/{branch}")


def resolve_ref(repo: pygit2.Repository, spec: str) -> ResolvedRef:
    """Resolve a user-supplied name to a commit: ``HEAD``, a full ref (``refs/...``), a branch,
    a tag, or a full or abbreviated (at least 7 digits) commit id. Nothing else: no revision
    expressions (``~``, ``^``, ``@{}``, ``:/``). Raises ``RefNotFound``."""
    if not isinstance(spec, str) or not spec or len(spec) > REF_MAX_LENGTH:
        raise RefNotFound("invalid ref")
    if not spec.isprintable():
        raise RefNotFound("invalid ref")
    if spec == "HEAD":
        commit = head_commit(repo)
        if commit is None:
            raise RefNotFound("the repository is empty")
        branch = default_branch(repo)
        if branch is None:
            return ResolvedRef(sha=str(commit.id), kind="commit")
        return ResolvedRef(sha=str(commit.id), kind="branch", ref=f"refs/heads/{branch}", name=branch)
    candidates = [spec] if spec.startswith("refs/") else [f"refs/heads/{spec}", f"refs/tags/{spec}"]
    for ref in candidates:
        if not pygit2.reference_is_valid_name(ref):
            continue
        commit = _ref_commit(repo, ref)
        if commit is not None:
            if ref.startswith("refs/heads/"):
                kind, name = "branch", ref.removeprefix("refs/heads/")
            elif ref.startswith("refs/tags/"):
                kind, name = "tag", ref.removeprefix("refs/tags/")
            else:
                kind, name = "commit", None
            return ResolvedRef(sha=str(commit.id), kind=kind, ref=ref, name=name)  # type: ignore[arg-type]
    if _HEX_RE.fullmatch(spec):
        try:
            obj = repo.get(spec.lower())
        except (ValueError, pygit2.GitError):  # ambiguous or malformed prefix
            obj = None
        commit = _peel_commit(obj) if obj is not None else None
        if commit is not None:
            return ResolvedRef(sha=str(commit.id), kind="commit")
    raise RefNotFound(f"no branch, tag or commit named {spec!r}")


def resolve_commit(repo: pygit2.Repository, spec: str | None) -> pygit2.Commit:
    """``resolve_ref`` as a commit object; ``None`` means the default branch."""
    if spec is None:
        commit = head_commit(repo)
        if commit is None:
            raise RefNotFound("the repository is empty")
        return commit
    return repo[resolve_ref(repo, spec).sha].peel(pygit2.Commit)


def _start_commit(repo: pygit2.Repository, ref: str | None) -> pygit2.Commit | None:
    if ref is None:
        return head_commit(repo)
    return resolve_commit(repo, ref)


# --- commits --------------------------------------------------------------------------------------


def _entry_id(tree: pygit2.Tree, path: str) -> pygit2.Oid | None:
    try:
        return tree[path].id
    except (KeyError, ValueError, pygit2.GitError):
        return None


def _touches(commit: pygit2.Commit, path: str) -> bool:
    """Whether ``commit`` changed ``path`` relative to every parent (a merge that takes the
    path unchanged from one parent is left out, like ``git log -- path`` does)."""
    mine = _entry_id(commit.tree, path)
    if not commit.parents:
        return mine is not None
    return all(_entry_id(parent.tree, path) != mine for parent in commit.parents)


def log(
    repo: pygit2.Repository,
    ref: str | None = None,
    *,
    page: int = 1,
    per_page: int = 30,
    path: str | None = None,
) -> CommitPage:
    """One page of history from ``ref`` (default branch when ``None``), newest first.

    ``path`` keeps the commits that changed that file or directory.
    """
    page = max(1, int(page))
    per_page = max(1, min(int(per_page), MAX_PER_PAGE))
    norm_path = validate_tree_path(path) if path else ""
    start = _start_commit(repo, ref)
    if start is None:
        return CommitPage(commits=[], page=page, per_page=per_page, has_next=False)
    walker = repo.walk(start.id, SortMode.TOPOLOGICAL | SortMode.TIME)
    commits = iter(walker)
    if norm_path:
        commits = (c for c in commits if _touches(c, norm_path))
    window = list(islice(commits, (page - 1) * per_page, page * per_page + 1))
    return CommitPage(
        commits=[commit_info(c) for c in window[:per_page]],
        page=page,
        per_page=per_page,
        has_next=len(window) > per_page,
    )


def get_commit(repo: pygit2.Repository, spec: str) -> CommitInfo:
    """One commit by id (full or abbreviated) or by ref."""
    return commit_info(resolve_commit(repo, spec))


# --- trees and blobs ------------------------------------------------------------------------------


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
    commit = _start_commit(repo, ref)
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
    commit = _start_commit(repo, ref)
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
    repo: pygit2.Repository, ref: str | None = None, *, max_text_bytes: int = DEFAULT_TEXT_LIMIT
) -> BlobInfo | None:
    """The README at the root of ``ref`` (``README.md`` first, any case), or ``None``."""
    commit = _start_commit(repo, ref)
    if commit is None:
        return None
    best: tuple[int, str] | None = None
    for entry in commit.tree:
        if entry.filemode not in (FileMode.BLOB, FileMode.BLOB_EXECUTABLE):
            continue
        name = decode_text(entry.raw_name or b"")
        lowered = name.lower()
        if lowered in README_NAMES:
            rank = (README_NAMES.index(lowered), name)
            best = rank if best is None or rank < best else best
    if best is None:
        return None
    return blob_info(repo, commit.tree, best[1], max_text_bytes=max_text_bytes, commit_sha=str(commit.id))


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
