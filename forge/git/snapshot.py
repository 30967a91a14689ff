"""Workspace in, snapshot out, with pygit2 and os only (no git command, no database).

`checkout` writes a commit's tree into a fresh directory and returns a manifest of what it wrote.
`snapshot` turns the work tree back into a commit **as an overlay on that base**: a path the
agent did not change keeps the base's exact entry (blob, mode, kind: executables, symlinks,
submodule links, big files), and a path the checkout did not write (a submodule link, a name the
host refused) is kept too, whatever the work tree holds there. Only the agent's changes are
judged; a change the rules refuse is listed in `skipped` and leaves the base's version (or
absence). A change set over the file-count or size cap raises `SnapshotTooLarge`; nothing is
ever cut silently.

Trees are serialized here (not with libgit2's tree builder), so that base entries with names
libgit2 would refuse to insert are carried over byte for byte.

Blocking: call through `RepoStore.read/write` (a worker thread)."""

import hashlib
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pygit2
from pygit2.enums import FileMode, ObjectType

from forge.git.bare import update_ref
from forge.git.pathcheck import blob_problem, escapes, link_problem, name_problem, shown
from forge.git.schemas import Identity

_TREE = int(FileMode.TREE)
_LINK = int(FileMode.LINK)
_COMMIT = int(FileMode.COMMIT)
_EXEC = int(FileMode.BLOB_EXECUTABLE)
_BLOB = int(FileMode.BLOB)
_CHUNK = 1 << 20
# File times come from a coarse kernel clock: a file written this close to the end of the
# checkout could be changed again within the same tick, unseen by its times ("racy git").
_RACY_NS = 100_000_000


class SnapshotLimits(msgspec.Struct, frozen=True, kw_only=True):
    """Per changed file, and for the agent's whole change set (never for the unchanged base)."""

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
    skipped: list[Skipped]  # agent changes refused (the base's version was kept)


class Checkout(msgspec.Struct, frozen=True, kw_only=True):
    """What `checkout` wrote: the leaves (files and symlinks) by path, and what it could not.

    `stats` holds (inode, size, mtime, ctime) of the files written: a file whose stat is still the
    same was not touched (the change time cannot be set from user space), so it is not re-read."""

    files: int
    written: frozenset[str]
    not_written: list[Skipped]
    stats: dict[str, tuple[int, int, int, int]] = {}


class SnapshotTooLarge(Exception):
    """The agent's changes pass the file-count or total-size cap: no snapshot (never a cut one)."""


Entry = tuple[int, pygit2.Oid]  # (file mode, object id)


def _owned(path: Path, owner: tuple[int, int] | None, *, directory: bool) -> None:
    if owner is not None and os.geteuid() == 0:
        os.chown(path, owner[0], owner[1], follow_symlinks=False)
    elif directory:
        path.chmod(0o777)


def checkout(repo: pygit2.Repository, sha: str, dest: Path, *, owner: tuple[int, int] | None = None) -> Checkout:
    """Write the tree of commit `sha` into the (fresh, empty) directory `dest`.

    `dest` is ours until the sandbox starts, so plain writes are safe. As root, what is written is
    chowned to `owner`; otherwise made writable for the sandbox's user. Submodule links are not
    written, nor a name the host refuses to create; both are listed and kept by `snapshot`."""
    commit = repo[sha].peel(pygit2.Commit)
    written: set[str] = set()
    not_written: list[Skipped] = []
    stats: dict[str, tuple[int, int, int, int]] = {}

    def write(tree: pygit2.Tree, into: Path, rel: str) -> None:
        for entry in tree:
            name = os.fsdecode(entry.raw_name or b"")
            path = rel + name
            if entry.filemode == _COMMIT:
                not_written.append(Skipped(path=shown(path), reason="a submodule link is not checked out"))
                continue
            if name in ("", ".", "..") or "/" in name or "\x00" in name or name.casefold().rstrip(" .") == ".git":
                not_written.append(Skipped(path=shown(path), reason="a name the checkout does not write"))
                continue
            if shown(name) != name:  # its manifest entry and any report of it could not be encoded
                not_written.append(Skipped(path=shown(path), reason="a name that is not UTF-8 is not checked out"))
                continue
            target = into / name
            try:
                if entry.filemode == _TREE:
                    target.mkdir()
                    _owned(target, owner, directory=True)
                    write(repo[entry.id].peel(pygit2.Tree), target, path + "/")
                    continue
                data = repo[entry.id].peel(pygit2.Blob).data
                if entry.filemode == _LINK:
                    target.symlink_to(os.fsdecode(data))
                else:
                    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
                    with os.fdopen(fd, "wb") as fh:
                        fh.write(data)
                    if entry.filemode == _EXEC:
                        target.chmod(0o755)
                    elif owner is None or os.geteuid() != 0:
                        target.chmod(0o666)
                _owned(target, owner, directory=False)
                st = target.lstat()
            except OSError as exc:
                not_written.append(Skipped(path=shown(path), reason=f"the host refused it: {exc.strerror}"))
                continue
            written.add(path)
            if entry.filemode != _LINK:
                stats[path] = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)

    write(commit.tree, dest, "")
    settled = time.time_ns() - _RACY_NS
    stats = {p: v for p, v in stats.items() if v[3] < settled}
    return Checkout(files=len(written), written=frozenset(written), not_written=not_written, stats=stats)


def flatten(repo: pygit2.Repository, tree: pygit2.Tree, prefix: str = "") -> Iterator[tuple[str, Entry]]:
    """Every non-tree entry of `tree`, by path (names decoded with `os.fsdecode`)."""
    for entry in tree:
        path = prefix + os.fsdecode(entry.raw_name or b"")
        if entry.filemode == _TREE:
            yield from flatten(repo, repo[entry.id].peel(pygit2.Tree), path + "/")
        else:
            yield path, (entry.filemode, entry.id)


def expected_checkout(repo: pygit2.Repository, sha: str) -> Checkout:
    """What `checkout` writes for `sha` on a host that refuses nothing, without stats (when the
    manifest of the real checkout is gone)."""
    tree = repo[sha].peel(pygit2.Commit).tree
    written = set()
    for path, (mode, _) in flatten(repo, tree):
        parts = path.split("/")
        if mode != _COMMIT and shown(path) == path and not any(p.casefold().rstrip(" .") == ".git" for p in parts):
            written.add(path)
    return Checkout(files=len(written), written=frozenset(written), not_written=[])


def _blob_id(fd: int, size: int) -> pygit2.Oid:
    """The blob id of a file read through `fd`, streamed (for big files the agent may not have touched)."""
    h = hashlib.sha1(b"blob %d\x00" % size, usedforsecurity=False)
    while chunk := os.read(fd, _CHUNK):
        h.update(chunk)
    return pygit2.Oid(hex=h.hexdigest())


def _read(fd: int, limit: int) -> bytes:
    chunks = []
    while limit > 0 and (chunk := os.read(fd, min(limit, _CHUNK))):
        chunks.append(chunk)
        limit -= len(chunk)
    return b"".join(chunks)


class _Overlay:
    """The agent's accepted changes against one base tree, found by walking the work tree."""

    def __init__(self, repo: pygit2.Repository, base: pygit2.Tree, manifest: Checkout, limits: SnapshotLimits):
        self.repo = repo
        self.limits = limits
        self.base = dict(flatten(repo, base))
        self.written = manifest.written
        self.stats = manifest.stats
        self.kept = {p for p in self.base if p not in self.written}  # never judged, never replaced
        self.base_dirs = {p[:i] for p in self.base for i in range(len(p)) if p[i] == "/"}
        self.kept_dirs = {p[:i] for p in self.kept for i in range(len(p)) if p[i] == "/"}
        self.changes: dict[str, Entry | None] = {}
        self.new_links: dict[str, str] = {}
        self.seen: set[str] = set()
        self.refused: dict[str, str] = {}
        self.total = 0

    def refuse(self, path: str, reason: str) -> None:
        self.refused[path] = reason
        self.changes.pop(path, None)
        self.new_links.pop(path, None)

    def change(self, path: str, entry: Entry, size: int) -> None:
        self.changes[path] = entry
        if len(self.changes) > self.limits.max_files:
            raise SnapshotTooLarge(f"the agent changed more than {self.limits.max_files} files")
        self.total += size
        if self.total > self.limits.max_total_bytes:
            raise SnapshotTooLarge(f"the agent's changes pass {self.limits.max_total_bytes} bytes")

    def walk(self, dir_fd: int, rel: str) -> None:
        with os.scandir(dir_fd) as it:
            names = sorted(e.name for e in it)
        for name in names:
            path = rel + name
            if path in self.kept:
                self.refuse(path, "kept from the base (the checkout did not write it)")
                continue
            if path not in self.base and path not in self.base_dirs:
                problem = name_problem(name)
                if problem is not None:
                    self.refuse(path, problem)
                    continue
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                child = self._open(dir_fd, name, path, os.O_DIRECTORY, "directory could not be opened")
                if child is None:
                    continue
                try:
                    self.walk(child, path + "/")
                finally:
                    os.close(child)
                continue
            self.seen.add(path)
            if path in self.kept_dirs:
                self.refuse(path, "would replace a directory holding entries kept from the base")
            elif stat.S_ISLNK(st.st_mode):
                self.link(dir_fd, name, path)
            elif stat.S_ISREG(st.st_mode):
                self.file(dir_fd, name, path, st)
            else:
                self.refuse(path, "not a regular file, directory or symlink")

    def _open(self, dir_fd: int, name: str, path: str, flags: int, what: str) -> int | None:
        try:
            return os.open(name, os.O_RDONLY | os.O_NOFOLLOW | flags, dir_fd=dir_fd)
        except OSError as exc:
            self.refuse(path, f"{what}: {exc.strerror}")
            return None

    def link(self, dir_fd: int, name: str, path: str) -> None:
        target = os.readlink(name, dir_fd=dir_fd)
        base = self.base.get(path)
        if base is not None and base[0] == _LINK and self.repo[base[1]].peel(pygit2.Blob).data == os.fsencode(target):
            return  # unchanged
        problem = link_problem(name, target)
        if problem is not None:
            self.refuse(path, problem)
            return
        self.new_links[path] = target
        self.change(path, (_LINK, self.repo.create_blob(os.fsencode(target))), 0)

    def file(self, dir_fd: int, name: str, path: str, st: os.stat_result) -> None:
        base = self.base.get(path)
        mode = _EXEC if st.st_mode & 0o100 else _BLOB
        if base is not None and self.stats.get(path) == (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns):
            return  # untouched since the checkout wrote it
        fd = self._open(dir_fd, name, path, os.O_NONBLOCK, "unreadable")
        if fd is None:
            return
        try:
            if st.st_size > self.limits.max_file_bytes:
                if self._same(path, base, mode, _blob_id(fd, st.st_size)):
                    return
                limit = self.limits.max_file_bytes
                self.refuse(path, f"{st.st_size} bytes, over the {limit} byte limit")
                return
            data = _read(fd, self.limits.max_file_bytes + 1)
        finally:
            os.close(fd)
        if len(data) > self.limits.max_file_bytes:
            self.refuse(path, "grew over the size limit while being read")
            return
        if self._same(path, base, mode, pygit2.hash(data)):
            return
        problem = blob_problem(name, data)
        if problem is not None:
            self.refuse(path, problem)
            return
        self.change(path, (mode, self.repo.create_blob(data)), len(data))

    def _same(self, path: str, base: Entry | None, mode: int, oid: pygit2.Oid) -> bool:
        """Whether the file holds the base's content. Then the base's exact mode stays (a 100664
        included), unless the executable bit alone changed: that is a change."""
        if base is None or base[0] in (_LINK, _COMMIT) or base[1] != oid:
            return False
        if (base[0] == _EXEC) != (mode == _EXEC):
            self.change(path, (mode, oid), 0)
        return True

    def deletions(self) -> None:
        """What the checkout wrote and the work tree no longer holds was deleted by the agent,
        unless the path (or a directory above it) was refused: then the base's version stays."""
        for path in self.written - self.seen:
            parts = path.split("/")
            if not any("/".join(parts[:i]) in self.refused for i in range(1, len(parts) + 1)):
                self.changes[path] = None

    def check_links(self) -> None:
        """Refuse new symlinks whose chain leaves the tree, through any link of the final tree,
        until none is left; a base link the agent left alone that escaped already is the base's
        business. A new link at a path whose base link escaped is new: it must stay inside."""
        base_links = {
            p: os.fsdecode(self.repo[oid].peel(pygit2.Blob).data)
            for p, (mode, oid) in self.base.items()
            if mode == _LINK
        }
        escaped_before = {p for p in base_links if escapes(p, base_links)[0]}
        while True:
            links = {p: t for p, t in base_links.items() if p not in self.changes}
            links.update(self.new_links)
            blamed: set[str] = set()
            for path in links:
                out, through = escapes(path, links)
                if out and (path in self.new_links or path not in escaped_before):
                    blamed |= through & self.new_links.keys()
            if not blamed:
                return
            for path in blamed:
                self.refuse(path, f"symlink chain resolves outside the work tree ({self.new_links[path]})")


def _write_tree(repo: pygit2.Repository, entries: dict[bytes, Entry]) -> pygit2.Oid:
    def order(name: bytes) -> bytes:
        return name + b"/" if entries[name][0] == _TREE else name

    raw = b"".join(b"%o %s\x00%s" % (entries[n][0], n, entries[n][1].raw) for n in sorted(entries, key=order))
    return repo.odb.write(ObjectType.TREE, raw)


def _apply(repo: pygit2.Repository, tree: pygit2.Tree | None, changes: dict[str, Entry | None]) -> pygit2.Oid | None:
    """`tree` with `changes` (relative paths) applied; untouched subtrees keep their ids. None: empty."""
    entries: dict[bytes, Entry] = {e.raw_name or b"": (e.filemode, e.id) for e in tree} if tree is not None else {}
    leaves: dict[str, Entry | None] = {}
    deeper: dict[str, dict[str, Entry | None]] = {}
    for path, change in changes.items():
        head, sep, rest = path.partition("/")
        if sep:
            deeper.setdefault(head, {})[rest] = change
        else:
            leaves[head] = change
    for name, change in leaves.items():
        if change is None:
            entries.pop(os.fsencode(name), None)
    for name, sub in deeper.items():
        key = os.fsencode(name)
        existing = entries.get(key)
        base = repo[existing[1]].peel(pygit2.Tree) if existing is not None and existing[0] == _TREE else None
        new = _apply(repo, base, sub)
        if new is None:
            entries.pop(key, None)
        else:
            entries[key] = (_TREE, new)
    for name, change in leaves.items():
        if change is not None:
            entries[os.fsencode(name)] = change
    return _write_tree(repo, entries) if entries else None


def snapshot(
    repo: pygit2.Repository,
    workspace: Path,
    *,
    branch: str,
    parent_sha: str,
    message: str,
    author: Identity,
    committer: Identity,
    limits: SnapshotLimits,
    manifest: Checkout | None = None,
) -> Snapshot:
    """Commit the agent's accepted changes to the checkout of `parent_sha` (`manifest` is what
    `checkout` returned) onto `branch` (created at `parent_sha` if missing). Nothing changed (the
    tree is the start tree): no commit, and the branch is neither created nor moved."""
    base_tree = repo[parent_sha].peel(pygit2.Commit).tree
    overlay = _Overlay(repo, base_tree, manifest or expected_checkout(repo, parent_sha), limits)
    root = os.open(workspace, os.O_RDONLY | os.O_DIRECTORY)
    try:
        overlay.walk(root, "")
    finally:
        os.close(root)
    overlay.deletions()
    overlay.check_links()
    tree_id = _apply(repo, base_tree, overlay.changes) or _write_tree(repo, {})
    # Shown safely: a refused name that is not UTF-8 must not break the JSON of what reports it.
    skipped = [Skipped(path=shown(p), reason=r) for p, r in sorted(overlay.refused.items())]
    ref = f"refs/heads/{branch}"
    current = repo.references.get(ref)
    current_sha = str(current.target) if current is not None else None
    head_sha = current_sha or parent_sha
    parent = repo[head_sha].peel(pygit2.Commit)
    # Compared with the start tree, not the branch tip: a run that changed nothing must not
    # revert what reached the branch while it ran, nor leave an empty task branch behind.
    if tree_id in (base_tree.id, parent.tree.id):
        return Snapshot(sha=head_sha, committed=False, changed_files=[], skipped=skipped)
    diff = repo[tree_id].peel(pygit2.Tree).diff_to_tree(parent.tree, swap=True)
    changed = sorted({shown(d.new_file.path or d.old_file.path) for d in diff.deltas})
    author_sig = pygit2.Signature(author.name, author.email)
    committer_sig = pygit2.Signature(committer.name, committer.email)
    commit_id = repo.create_commit(None, author_sig, committer_sig, message, tree_id, [parent.id])
    update_ref(repo, ref, str(commit_id), expected_old=current_sha, message=f"snapshot: {message.splitlines()[0]}")
    return Snapshot(sha=str(commit_id), committed=True, changed_files=changed, skipped=skipped)
