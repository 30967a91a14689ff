"""A commit's tree written into a fresh work tree (`checkout`), and the manifest of what was
written: the leaves by path with their stats, and what was not written (submodule links, names
the host refuses). `snapshot` reads the work tree back against this manifest.

Blocking: call through `RepoStore.read/write` (a worker thread)."""

import os
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pygit2
from pygit2.enums import FileMode

from forge.git.pathcheck import shown

TREE_MODE = int(FileMode.TREE)
LINK_MODE = int(FileMode.LINK)
COMMIT_MODE = int(FileMode.COMMIT)
EXEC_MODE = int(FileMode.BLOB_EXECUTABLE)
BLOB_MODE = int(FileMode.BLOB)
# File times come from a coarse kernel clock: a file written this close to the end of the
# checkout could be changed again within the same tick, unseen by its times ("racy git").
_RACY_NS = 100_000_000


Entry = tuple[int, pygit2.Oid]  # (file mode, object id)


class Skipped(msgspec.Struct, frozen=True, kw_only=True):
    path: str
    reason: str


class Checkout(msgspec.Struct, frozen=True, kw_only=True):
    """What `checkout` wrote: the leaves (files and symlinks) by path, and what it could not.

    `stats` holds (inode, size, mtime, ctime) of the files written: a file whose stat is still the
    same was not touched (the change time cannot be set from user space), so it is not re-read."""

    files: int
    written: frozenset[str]
    not_written: list[Skipped]
    stats: dict[str, tuple[int, int, int, int]] = {}


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
            if entry.filemode == COMMIT_MODE:
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
                if entry.filemode == TREE_MODE:
                    target.mkdir()
                    _owned(target, owner, directory=True)
                    write(repo[entry.id].peel(pygit2.Tree), target, path + "/")
                    continue
                data = repo[entry.id].peel(pygit2.Blob).data
                if entry.filemode == LINK_MODE:
                    target.symlink_to(os.fsdecode(data))
                else:
                    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
                    with os.fdopen(fd, "wb") as fh:
                        fh.write(data)
                    if entry.filemode == EXEC_MODE:
                        target.chmod(0o755)
                    elif owner is None or os.geteuid() != 0:
                        target.chmod(0o666)
                _owned(target, owner, directory=False)
                st = target.lstat()
            except OSError as exc:
                not_written.append(Skipped(path=shown(path), reason=f"the host refused it: {exc.strerror}"))
                continue
            written.add(path)
            if entry.filemode != LINK_MODE:
                stats[path] = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)

    write(commit.tree, dest, "")
    settled = time.time_ns() - _RACY_NS
    stats = {p: v for p, v in stats.items() if v[3] < settled}
    return Checkout(files=len(written), written=frozenset(written), not_written=not_written, stats=stats)


def flatten(repo: pygit2.Repository, tree: pygit2.Tree, prefix: str = "") -> Iterator[tuple[str, Entry]]:
    """Every non-tree entry of `tree`, by path (names decoded with `os.fsdecode`)."""
    for entry in tree:
        path = prefix + os.fsdecode(entry.raw_name or b"")
        if entry.filemode == TREE_MODE:
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
        if mode != COMMIT_MODE and shown(path) == path and not any(p.casefold().rstrip(" .") == ".git" for p in parts):
            written.add(path)
    return Checkout(files=len(written), written=frozenset(written), not_written=[])
