"""The agent's accepted changes against one base tree (`Overlay`), found by walking the work tree
that `checkout` wrote: a path the agent did not change keeps the base's exact entry, a change the
rules refuse (`forge.git.pathcheck`) is listed with its reason, and a change set over the limits
(`SnapshotLimits`) raises `SnapshotTooLarge`: nothing is ever cut silently."""

import hashlib
import os
import stat

import msgspec
import pygit2

from forge.git.checkout import BLOB_MODE, COMMIT_MODE, EXEC_MODE, LINK_MODE, Checkout, Entry, flatten
from forge.git.pathcheck import blob_problem, escapes, link_problem, name_problem

_CHUNK = 1 << 20


class SnapshotLimits(msgspec.Struct, frozen=True, kw_only=True):
    """Per changed file, and for the agent's whole change set (never for the unchanged base)."""

    max_file_bytes: int = 10 * 1024 * 1024
    max_total_bytes: int = 512 * 1024 * 1024
    max_files: int = 50_000


class SnapshotTooLarge(Exception):
    """The agent's changes pass the file-count or total-size cap: no snapshot (never a cut one)."""


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


class Overlay:
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
        if (
            base is not None
            and base[0] == LINK_MODE
            and self.repo[base[1]].peel(pygit2.Blob).data == os.fsencode(target)
        ):
            return  # unchanged
        problem = link_problem(name, target)
        if problem is not None:
            self.refuse(path, problem)
            return
        self.new_links[path] = target
        self.change(path, (LINK_MODE, self.repo.create_blob(os.fsencode(target))), 0)

    def file(self, dir_fd: int, name: str, path: str, st: os.stat_result) -> None:
        base = self.base.get(path)
        mode = EXEC_MODE if st.st_mode & 0o100 else BLOB_MODE
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
        if base is None or base[0] in (LINK_MODE, COMMIT_MODE) or base[1] != oid:
            return False
        if (base[0] == EXEC_MODE) != (mode == EXEC_MODE):
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
            if mode == LINK_MODE
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
