"""Reading a repository: branches, tags, resolving names to commits, the commit log.

Every function takes an open ``pygit2.Repository`` and is synchronous (run it through
``RepoStore.read``). An empty repository is not an error: lists are empty, the log has no
commits; only an explicitly named ref that does not exist raises ``RefNotFound``.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, timezone
from itertools import islice

import pygit2
from pygit2.enums import SortMode

from forge.git.bare import default_branch
from forge.git.errors import RefNotFound
from forge.git.names import REF_MAX_LENGTH, validate_tree_path
from forge.git.schemas import (
    BranchInfo,
    CommitInfo,
    CommitPage,
    RefNames,
    ResolvedRef,
    Signature,
    TagInfo,
)

MAX_PER_PAGE = 100
MIN_ABBREV = 7
_HEX_RE = re.compile(r"[0-9a-fA-F]{7,64}", re.ASCII)


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


def ref_names(repo: pygit2.Repository) -> RefNames:
    """Every branch name (the default first) and tag name, without reading their commits."""
    return RefNames(
        branches=[b.name for b in list_branches(repo, with_commits=False)],
        tags=[ref.removeprefix("refs/tags/") for ref in _ref_names(repo, "refs/tags/")],
    )


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


def start_commit(repo: pygit2.Repository, ref: str | None) -> pygit2.Commit | None:
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
    start = start_commit(repo, ref)
    if start is None:
        return CommitPage(commits=[], page=page, per_page=per_page, has_next=False)
    # Commit-time order only (like ``git log``): libgit2 then walks lazily, so page 1 of a
    # repository with a million commits does not visit them all (topological order would).
    walker = repo.walk(start.id, SortMode.TIME)
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


def snapshot_refs(repo: pygit2.Repository) -> dict[str, str]:
    """Every branch and tag with the id it points at (``refs/...`` -> sha), e.g. to record the
    refs of a repository before and after a change."""
    refs: dict[str, str] = {}
    for name in _ref_names(repo, "refs/"):
        if not name.startswith(("refs/heads/", "refs/tags/")):
            continue
        reference = repo.references.get(name)
        if reference is None:
            continue
        try:
            refs[name] = str(reference.resolve().target)
        except (KeyError, pygit2.GitError):
            continue
    return refs
