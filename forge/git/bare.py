"""Bare repositories on disk: create, seed, commit, rename, delete, import, default branch.

Every function here is synchronous and blocking; the host calls them through ``RepoStore``.
Paths come from ``names.repo_path`` (validated, traversal-proof).
"""

from __future__ import annotations

import contextlib
import enum
import os
import secrets
import shutil
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pygit2
from pygit2.enums import FileMode, ObjectType

from forge.git import fences
from forge.git.errors import (
    ImportFailed,
    InvalidPath,
    RefConflict,
    RefNotFound,
    RepoExists,
    RepoNotFound,
)
from forge.git.gitcmd import run_git
from forge.git.names import validate_branch_name, validate_ref_name, validate_tree_path
from forge.git.schemas import Identity

#: Written into every repository's config at creation and import.
REPO_CONFIG: dict[str, str] = {
    "core.logAllRefUpdates": "true",
    "receive.fsckObjects": "true",
    "transfer.fsckObjects": "true",
    "fetch.fsckObjects": "true",
    # Fast-forward and deletion rules are ours (refrules + the pre-receive hook), not git's.
    "receive.denyNonFastForwards": "false",
    "receive.denyDeletes": "false",
    "http.receivepack": "true",
    "uploadpack.allowFilter": "true",
}

_TRASH_DIR = ".trash"
_TMP_PREFIX = ".tmp-"


def open_repo(path: Path) -> pygit2.Repository:
    """Open the bare repository at ``path`` or raise ``RepoNotFound``."""
    if not (path / "HEAD").is_file():
        raise RepoNotFound(f"no repository at {path.name}")
    try:
        return pygit2.Repository(str(path), pygit2.enums.RepositoryOpenFlag.BARE)
    except pygit2.GitError as exc:
        raise RepoNotFound(f"no repository at {path.name}") from exc


def apply_repo_config(path: Path) -> None:
    repo = open_repo(path)
    for key, value in REPO_CONFIG.items():
        repo.config[key] = value


def _tmp_sibling(path: Path) -> Path:
    return path.parent / f"{_TMP_PREFIX}{path.name}-{secrets.token_hex(6)}"


def _move_into_place(tmp: Path, path: Path) -> None:
    """Rename a fully prepared ``tmp`` directory to ``path``; never replaces a repository."""
    try:
        tmp.rename(path)  # atomic; fails if ``path`` is a non-empty directory
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise RepoExists(f"repository {path.name} already exists") from exc


def init_repo(
    path: Path,
    *,
    default_branch: str = "main",
    description: str | None = None,
    readme_author: Identity | None = None,
    readme_title: str | None = None,
) -> str | None:
    """Create a bare repository at ``path``; with ``readme_author``, commit a README on the
    default branch. Returns the initial commit sha, or ``None`` for an empty repository.

    The repository is prepared in a temporary sibling directory and renamed into place, so a
    half-created repository is never visible.
    """
    validate_branch_name(default_branch)
    if path.exists():
        raise RepoExists(f"repository {path.name} already exists")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_sibling(path)
    try:
        repo = pygit2.init_repository(str(tmp), bare=True, initial_head=default_branch, description=description)
        for key, value in REPO_CONFIG.items():
            repo.config[key] = value
        sha = None
        if readme_author is not None:
            title = readme_title or path.name.removesuffix(".git")
            body = f"# {title}\n"
            if description:
                body += f"\n{description}\n"
            sha = write_commit(
                repo,
                branch=default_branch,
                files={"README.md": body.encode()},
                message="Initial commit",
                author=readme_author,
                expected_old=None,
            )
        del repo
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _move_into_place(tmp, path)
    return sha


def _signature(identity: Identity, when: datetime | None) -> pygit2.Signature:
    if when is None:
        return pygit2.Signature(identity.name, identity.email)
    offset = when.utcoffset()
    minutes = int(offset.total_seconds() // 60) if offset is not None else 0
    return pygit2.Signature(identity.name, identity.email, int(when.timestamp()), minutes)


def _build_tree(
    repo: pygit2.Repository,
    base: pygit2.Tree | None,
    changes: Mapping[str, tuple[pygit2.Oid, int] | None],
) -> pygit2.Oid | None:
    """Apply ``changes`` (relative path -> (oid, mode) or None to delete) on top of ``base``;
    returns the new tree id, or ``None`` when the tree ends up empty."""
    builder = repo.TreeBuilder(base) if base is not None else repo.TreeBuilder()
    nested: dict[str, dict[str, tuple[pygit2.Oid, int] | None]] = {}
    for rel, change in changes.items():
        head, sep, rest = rel.partition("/")
        if sep:
            nested.setdefault(head, {})[rest] = change
        elif change is None:
            if base is not None and head in base:
                builder.remove(head)
        else:
            builder.insert(head, change[0], change[1])
    for name, sub in nested.items():
        existing: pygit2.Tree | None = None
        if base is not None and name in base:
            obj = base[name]
            if isinstance(obj, pygit2.Tree):
                existing = obj
        tree_id = _build_tree(repo, existing, sub)
        if tree_id is None:
            if base is not None and name in base:
                builder.remove(name)
        else:
            builder.insert(name, tree_id, FileMode.TREE)
    if len(builder) == 0:
        return None
    return builder.write()


class _Unset(enum.Enum):
    UNSET = 0


_KEEP = _Unset.UNSET


def write_commit(
    repo: pygit2.Repository,
    *,
    branch: str,
    files: Mapping[str, bytes | str | None],
    message: str,
    author: Identity,
    committer: Identity | None = None,
    modes: Mapping[str, int] | None = None,
    expected_old: str | _Unset | None = _KEEP,
    when: datetime | None = None,
) -> str:
    """Commit ``files`` (path -> content, or ``None`` to delete) on top of ``branch``.

    ``modes`` may give a path ``0o100755`` (executable) or ``0o120000`` (symlink, the content is
    the target). With ``expected_old`` (a sha, or ``None`` for "branch must not exist") the ref is
    updated with compare-and-swap; otherwise it must still be where it was when we read it.
    Returns the new commit sha.
    """
    validate_branch_name(branch)
    ref = f"refs/heads/{branch}"
    current = repo.references.get(ref)
    current_sha = str(current.target) if current is not None else None
    if expected_old is not _KEEP and expected_old != current_sha:
        raise RefConflict(f"{ref} is at {current_sha}, expected {expected_old}")
    base_tree: pygit2.Tree | None = None
    parents: list[pygit2.Oid] = []
    if current_sha is not None:
        parent = repo[current_sha].peel(pygit2.Commit)
        base_tree = parent.tree
        parents = [parent.id]
    changes: dict[str, tuple[pygit2.Oid, int] | None] = {}
    for raw_path, content in files.items():
        path = validate_tree_path(raw_path)
        if not path:
            raise InvalidPath("cannot write the root as a file")
        if content is None:
            changes[path] = None
            continue
        data = content.encode() if isinstance(content, str) else content
        mode = (modes or {}).get(path, FileMode.BLOB)
        if mode not in (FileMode.BLOB, FileMode.BLOB_EXECUTABLE, FileMode.LINK):
            raise InvalidPath(f"unsupported file mode {mode:o} for {path}")
        changes[path] = (repo.create_blob(data), int(mode))
    tree_id = _build_tree(repo, base_tree, changes)
    if tree_id is None:
        tree_id = repo.TreeBuilder().write()
    sig_author = _signature(author, when)
    sig_committer = _signature(committer or author, when)
    commit_id = repo.create_commit(None, sig_author, sig_committer, message, tree_id, parents)
    update_ref(repo, ref, str(commit_id), expected_old=current_sha, message=f"commit: {message}")
    return str(commit_id)


def update_ref(
    repo: pygit2.Repository,
    ref: str,
    new: str | None,
    *,
    expected_old: str | None,
    message: str = "forgehand",
    fence: str | None = None,
) -> None:
    """Compare-and-swap ``ref`` from ``expected_old`` (``None``: must not exist) to ``new``
    (``None``: delete). Raises ``RefConflict`` if the ref moved meanwhile. With ``fence`` (a run's
    id), only while that run's fence is held, checked under its lock (``Fenced`` otherwise:
    ``forge.git.fences``)."""
    validate_ref_name(ref)
    with repo.transaction() as txn:
        if fence is not None:
            fences.check_held(repo, txn, fence)  # the fence's lock first, then the ref's
        txn.lock_ref(ref)
        existing = repo.references.get(ref)
        existing_sha = str(existing.target) if existing is not None else None
        if existing_sha != expected_old:
            raise RefConflict(f"{ref} is at {existing_sha}, expected {expected_old}")
        if new is None:
            if existing is not None:
                txn.remove(ref)
        else:
            txn.set_target(ref, new, message=message)


def default_branch(repo: pygit2.Repository) -> str | None:
    """The branch ``HEAD`` points at (it may not exist yet), or ``None`` for a detached HEAD."""
    try:
        head = repo.references["HEAD"]
    except KeyError:
        return None
    target = head.target
    if isinstance(target, str) and target.startswith("refs/heads/"):
        return target.removeprefix("refs/heads/")
    return None


def set_default_branch(repo: pygit2.Repository, branch: str) -> None:
    """Point ``HEAD`` at ``branch``; it must exist unless the repository has no branch at all."""
    validate_branch_name(branch)
    ref = f"refs/heads/{branch}"
    if ref not in repo.references and repo.listall_branches():
        raise RefNotFound(f"branch {branch!r} does not exist")
    repo.references.create("HEAD", ref, force=True)


def rename_repo(old_path: Path, new_path: Path) -> None:
    """Move a repository directory (the caller built both paths with ``repo_path``)."""
    if not (old_path / "HEAD").is_file():
        raise RepoNotFound(f"no repository at {old_path.name}")
    if old_path == new_path:
        return
    if new_path.exists():
        raise RepoExists(f"repository {new_path.name} already exists")
    new_path.parent.mkdir(parents=True, exist_ok=True)
    try:
        old_path.rename(new_path)
    except OSError as exc:
        raise RepoExists(f"cannot move repository to {new_path.name}: {exc.strerror}") from exc
    with contextlib.suppress(OSError):
        old_path.parent.rmdir()  # drop an owner directory left empty


def rename_owner(old_dir: Path, new_dir: Path) -> None:
    """Move every repository of an owner (``names.owner_path`` for both)."""
    if old_dir == new_dir or not old_dir.exists():
        return
    if new_dir.exists():
        raise RepoExists(f"owner directory {new_dir.name} already exists")
    old_dir.rename(new_dir)


def delete_repo(path: Path) -> None:
    """Delete a repository: renamed out of sight at once (atomic), then removed."""
    if not (path / "HEAD").is_file():
        raise RepoNotFound(f"no repository at {path.name}")
    trash = path.parent.parent / _TRASH_DIR
    trash.mkdir(exist_ok=True)
    doomed = trash / f"{path.parent.name}-{path.name}-{secrets.token_hex(6)}"
    path.rename(doomed)
    shutil.rmtree(doomed, ignore_errors=True)
    with contextlib.suppress(OSError):
        path.parent.rmdir()


def _local_source(source: str) -> Path:
    """A local path or ``file://`` URL, as an existing absolute directory."""
    if source.startswith("file://"):
        parts = urlsplit(source)
        if parts.netloc not in ("", "localhost") or parts.query or parts.fragment:
            raise ImportFailed("only file:// URLs of this machine can be imported")
        local = Path(unquote(parts.path))
    elif "://" in source or "::" in source:
        raise ImportFailed("only a local path or a file:// URL can be imported")
    else:
        local = Path(source)
    local = local.expanduser().resolve()
    if not local.is_dir():
        raise ImportFailed(f"{source} is not a directory")
    return local


_IMPORTED_NAMESPACES = ("refs/heads/", "refs/tags/", "refs/notes/")


def import_repo(path: Path, source: str, *, timeout: float = 3600) -> None:
    """Import every branch and tag of the repository at ``source`` (a local path or a
    ``file://`` URL) as a new bare repository at ``path``.

    Runs ``git clone --mirror --no-local`` (objects go through the pack protocol and are
    checked with ``transfer.fsckObjects``; nothing is hard-linked or shared through alternates),
    keeps only branches, tags and notes, drops the remote, then ``git fsck``.
    """
    if path.exists():
        raise RepoExists(f"repository {path.name} already exists")
    local = _local_source(source)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_sibling(path)
    safety = {
        "protocol.allow": "never",
        "protocol.file.allow": "always",
        "transfer.fsckObjects": "true",
        "core.hooksPath": os.devnull,
        # The operator chose this source explicitly: do not refuse it for its file owner.
        "safe.directory": str(local),
    }
    try:
        try:
            run_git(
                ["clone", "--mirror", "--no-local", "--no-hardlinks", "--quiet", "--",
                 str(local), str(tmp)],
                config=safety,
                timeout=timeout,
            )  # fmt: skip
            run_git(["config", "--remove-section", "remote.origin"], cwd=tmp, check=False)
            refs = run_git(["for-each-ref", "--format=%(refname)"], cwd=tmp).stdout.decode()
            doomed = [r for r in refs.splitlines() if r and not r.startswith(_IMPORTED_NAMESPACES)]
            if doomed:
                stdin = "".join(f"delete {r}\n" for r in doomed).encode()
                run_git(["update-ref", "--stdin"], cwd=tmp, input=stdin)
            run_git(["fsck", "--no-progress", "--no-dangling"], cwd=tmp, timeout=timeout)
        except Exception as exc:
            raise ImportFailed(f"import of {source} failed: {exc}") from exc
        apply_repo_config(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _move_into_place(tmp, path)


def fsck(path: Path, *, strict: bool = False, timeout: float = 3600) -> tuple[bool, str]:
    """Run ``git fsck``; returns (clean, output)."""
    args = ["fsck", "--no-progress", *(["--strict"] if strict else [])]
    proc = run_git(args, cwd=path, timeout=timeout, check=False)
    output = (proc.stdout + proc.stderr).decode("utf-8", "replace")
    return proc.returncode == 0, output


def object_type(repo: pygit2.Repository, sha: str) -> ObjectType | None:
    try:
        kind, _size = repo.odb.read_header(sha)
    except (KeyError, ValueError, pygit2.GitError):
        return None
    return kind
