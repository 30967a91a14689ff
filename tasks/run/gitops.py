"""Workspace in, snapshot out: the host writes a commit's tree into the workspace and later reads
the work tree back into a commit, with pygit2 only. No git command ever runs in a directory the
agent can write, and the sandbox's `.git` (if it made one) is never read.

Blocking functions: call them through `RepoStore.read/write` (a worker thread)."""

import contextlib
import os
import stat
from pathlib import Path

import msgspec
import pygit2
from pygit2.enums import FileMode

from forge.git import Identity
from forge.git.bare import update_ref
from sandbox.spec import SANDBOX_GID, SANDBOX_UID


class SnapshotLimits(msgspec.Struct, frozen=True, kw_only=True):
    max_file_bytes: int = 10 * 1024 * 1024
    max_total_bytes: int = 512 * 1024 * 1024
    max_files: int = 50_000


class Skipped(msgspec.Struct, frozen=True, kw_only=True):
    path: str
    reason: str


class Snapshot(msgspec.Struct, frozen=True, kw_only=True):
    sha: str  # the new head (or the old one when nothing changed)
    committed: bool
    changed_files: list[str]
    skipped: list[Skipped]


def _owned(path: Path, *, directory: bool) -> None:
    if os.geteuid() == 0:
        os.chown(path, SANDBOX_UID, SANDBOX_GID, follow_symlinks=False)
    elif directory:
        path.chmod(0o777)


def checkout_tree(repo: pygit2.Repository, sha: str, dest: Path) -> int:
    """Write the tree of commit `sha` into the (fresh, empty) directory `dest`. Returns files written.

    `dest` is ours until the sandbox starts, so plain writes are safe here."""
    commit = repo[sha].peel(pygit2.Commit)
    count = 0

    def write(tree: pygit2.Tree, into: Path) -> None:
        nonlocal count
        for entry in tree:
            name = entry.name or ""
            if name in ("", ".", "..", ".git") or "/" in name or "\x00" in name:
                continue
            target = into / name
            obj = repo[entry.id]
            if entry.filemode == FileMode.TREE:
                target.mkdir()
                _owned(target, directory=True)
                write(obj.peel(pygit2.Tree), target)
            elif entry.filemode == FileMode.LINK:
                target.symlink_to(obj.peel(pygit2.Blob).data.decode("utf-8", "surrogateescape"))
                _owned(target, directory=False)
                count += 1
            elif entry.filemode in (FileMode.BLOB, FileMode.BLOB_EXECUTABLE):
                fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
                with os.fdopen(fd, "wb") as fh:
                    fh.write(obj.peel(pygit2.Blob).data)
                if entry.filemode == FileMode.BLOB_EXECUTABLE:
                    target.chmod(0o755)
                elif os.geteuid() != 0:
                    target.chmod(0o666)
                _owned(target, directory=False)
                count += 1
            # submodules (commit entries) are not checked out

    write(commit.tree, dest)
    return count


class _Scan:
    def __init__(self, root: Path, limits: SnapshotLimits) -> None:
        self.root = root
        self.limits = limits
        self.skipped: list[Skipped] = []
        self.total = 0
        self.files = 0


def _link_escapes(rel_dir: str, target: str) -> bool:
    if not target or target.startswith("/") or "\x00" in target:
        return True
    depth = len([p for p in rel_dir.split("/") if p])
    for part in target.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            depth -= 1
            if depth < 0:
                return True
        else:
            depth += 1
    return False


def _build(repo: pygit2.Repository, scan: _Scan, dir_fd: int, rel: str) -> pygit2.Oid | None:
    """Build the tree of one directory (reached through O_NOFOLLOW fds) bottom-up."""
    builder = repo.TreeBuilder()
    with os.scandir(dir_fd) as it:
        entries = sorted(it, key=lambda e: e.name)
    for entry in entries:
        name = entry.name
        path = f"{rel}{name}"
        if name == ".git":
            scan.skipped.append(Skipped(path=path, reason="git metadata is never taken from the sandbox"))
            continue
        if "\x00" in name or "\\" in name:
            scan.skipped.append(Skipped(path=path, reason="unsupported file name"))
            continue
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if stat.S_ISLNK(st.st_mode):
            target = os.readlink(name, dir_fd=dir_fd)
            if _link_escapes(rel, target):
                scan.skipped.append(Skipped(path=path, reason=f"symlink points outside the work tree ({target})"))
                continue
            builder.insert(name, repo.create_blob(os.fsencode(target)), FileMode.LINK)
        elif stat.S_ISDIR(st.st_mode):
            try:
                child = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd)
            except OSError:
                scan.skipped.append(Skipped(path=path, reason="directory could not be opened"))
                continue
            try:
                sub = _build(repo, scan, child, path + "/")
            finally:
                os.close(child)
            if sub is not None:
                builder.insert(name, sub, FileMode.TREE)
        elif stat.S_ISREG(st.st_mode):
            if st.st_size > scan.limits.max_file_bytes:
                scan.skipped.append(
                    Skipped(path=path, reason=f"{st.st_size} bytes, over the {scan.limits.max_file_bytes} byte limit")
                )
                continue
            if scan.files >= scan.limits.max_files or scan.total + st.st_size > scan.limits.max_total_bytes:
                scan.skipped.append(Skipped(path=path, reason="the snapshot's size or file count limit was reached"))
                continue
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
            except OSError as exc:
                scan.skipped.append(Skipped(path=path, reason=f"unreadable: {exc.strerror}"))
                continue
            with os.fdopen(fd, "rb") as fh:
                data = fh.read(scan.limits.max_file_bytes + 1)
            if len(data) > scan.limits.max_file_bytes:
                scan.skipped.append(Skipped(path=path, reason="grew over the size limit while being read"))
                continue
            scan.files += 1
            scan.total += len(data)
            mode = FileMode.BLOB_EXECUTABLE if st.st_mode & 0o100 else FileMode.BLOB
            builder.insert(name, repo.create_blob(data), mode)
        else:
            scan.skipped.append(Skipped(path=path, reason="not a regular file, directory or symlink"))
    if len(builder) == 0:
        return None
    return builder.write()


def _changed(repo: pygit2.Repository, old_tree: pygit2.Tree | None, new_tree: pygit2.Tree) -> list[str]:
    diff = new_tree.diff_to_tree(old_tree, swap=True) if old_tree is not None else new_tree.diff_to_tree(swap=True)
    paths: list[str] = []
    for delta in diff.deltas:
        paths.append(delta.new_file.path if delta.status != pygit2.enums.DeltaStatus.DELETED else delta.old_file.path)
    return sorted(set(paths))


def snapshot_commit(
    repo: pygit2.Repository,
    workspace: Path,
    *,
    branch: str,
    parent_sha: str,
    message: str,
    author: Identity,
    committer: Identity,
    limits: SnapshotLimits,
) -> Snapshot:
    """Commit the accepted work tree onto `branch` (created at `parent_sha` if missing).

    The commit's tree is exactly the accepted work tree. Nothing changed: no commit."""
    scan = _Scan(workspace, limits)
    root = os.open(workspace, os.O_RDONLY | os.O_DIRECTORY)
    try:
        tree_id = _build(repo, scan, root, "")
    finally:
        os.close(root)
    if tree_id is None:
        tree_id = repo.TreeBuilder().write()
    ref = f"refs/heads/{branch}"
    current = repo.references.get(ref)
    current_sha = str(current.target) if current is not None else None
    head_sha = current_sha or parent_sha
    parent = repo[head_sha].peel(pygit2.Commit)
    new_tree = repo[tree_id].peel(pygit2.Tree)
    changed = _changed(repo, parent.tree, new_tree)
    if parent.tree.id == tree_id:
        if current_sha is None:
            update_ref(repo, ref, head_sha, expected_old=None, message="task branch")
        return Snapshot(sha=head_sha, committed=False, changed_files=[], skipped=scan.skipped)
    author_sig = pygit2.Signature(author.name, author.email)
    committer_sig = pygit2.Signature(committer.name, committer.email)
    commit_id = repo.create_commit(None, author_sig, committer_sig, message, tree_id, [parent.id])
    update_ref(repo, ref, str(commit_id), expected_old=current_sha, message=f"snapshot: {message.splitlines()[0]}")
    return Snapshot(sha=str(commit_id), committed=True, changed_files=changed, skipped=scan.skipped)


def branch_sha(repo: pygit2.Repository, branch: str) -> str | None:
    ref = repo.references.get(f"refs/heads/{branch}")
    if ref is None:
        return None
    with contextlib.suppress(Exception):
        return str(repo[ref.target].peel(pygit2.Commit).id)
    return None
