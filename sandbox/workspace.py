"""Host-side access to a workspace the agent can write: never follow a link out of it.

The agent controls every name in the workspace and can swap a directory for a symlink at any moment,
so checking a resolved path and then opening it is not enough. Each call opens the workspace root
once and walks down one component at a time with `dir_fd` and O_NOFOLLOW (openat-style): no
component is ever resolved through a symlink, whatever the agent does in between. Files must be
regular files (a FIFO would hang the reader, a device is never wanted) and within the size cap.
"""

import contextlib
import errno
import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import msgspec

from .errors import WorkspaceFileTooLarge, WorkspacePathRefused
from .quota import is_mounted, mount_quota, unmount_quota
from .spec import SANDBOX_GID, SANDBOX_UID

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0)

EntryKind = Literal["file", "dir", "symlink", "other"]


class WorkspaceEntry(msgspec.Struct, frozen=True):
    name: str
    kind: EntryKind
    size: int  # bytes for files, 0 otherwise


def prepare_workspace(path: Path, *, limit_bytes: int | None = None) -> Path:
    """Create the host directory and make it writable by the sandbox user (uid 1000).

    With `limit_bytes`, the directory becomes its own filesystem of that size first (`quota.mount_quota`,
    root only, else WorkspaceQuotaUnavailable): nothing written there can take more of the host's disk.
    Without it the directory is plain, and only the sandbox's watchdog (`Limits.workspace_bytes`) looks.

    As root the directory is chowned to 1000:1000. Otherwise it is made mode 0o777 (the sandbox's uid
    differs from ours; a rootless or userns-remapped engine should chown instead).
    """
    path.mkdir(parents=True, exist_ok=True)
    if limit_bytes is not None:
        mount_quota(path, limit_bytes, owner=(SANDBOX_UID, SANDBOX_GID))
    if os.geteuid() == 0:
        os.chown(path, SANDBOX_UID, SANDBOX_GID)
        path.chmod(0o755)
    else:
        path.chmod(0o777)
    return path


def remove_workspace(path: Path) -> None:
    """Delete a workspace: unmount its quota filesystem (if any), delete its image, then the directory."""
    unmount_quota(path)
    if not is_mounted(path):  # never delete through a mount that is still there
        shutil.rmtree(path, ignore_errors=True)


def split_relpath(relpath: str) -> list[str]:
    """Validate a workspace-relative path and return its components ("" or "." is the root)."""
    if "\x00" in relpath:
        raise WorkspacePathRefused("path contains NUL")
    if relpath.startswith(("/", "\\")):
        raise WorkspacePathRefused(f"absolute path refused: {relpath!r}")
    parts = [p for p in relpath.split("/") if p not in ("", ".")]
    for part in parts:
        if part == "..":
            raise WorkspacePathRefused(f"'..' refused: {relpath!r}")
    return parts


def _open_root(root: Path) -> int:
    try:
        # The root itself is the forge's own path: follow it, but it must be a directory.
        return os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise WorkspacePathRefused(f"workspace root {str(root)!r} cannot be opened: {exc.strerror}") from exc


def _open_dir_at(parent: int, name: str, relpath: str, *, create: bool = False) -> int:
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent)
    except FileNotFoundError:
        if not create:
            raise
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o755, dir_fd=parent)
            _give_to_owner_at(parent, name)
        return _open_dir_at(parent, name, relpath)
    except OSError as exc:
        # O_NOFOLLOW on a symlink gives ELOOP; O_DIRECTORY on a non-directory gives ENOTDIR.
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise WorkspacePathRefused(f"{relpath!r}: {name!r} is a symlink or not a directory") from exc
        raise


@contextlib.contextmanager
def _walk_to_parent(root: Path, parts: list[str], relpath: str, *, create: bool = False) -> Iterator[int]:
    """Yield an fd of the directory holding the last component, reached without following links."""
    fds = [_open_root(root)]
    try:
        for name in parts[:-1]:
            fds.append(_open_dir_at(fds[-1], name, relpath, create=create))
        yield fds[-1]
    finally:
        for fd in fds:
            os.close(fd)


def _give_to_owner_at(dir_fd: int, name: str) -> None:
    """Files the (root) host writes belong to whoever owns the directory, so the agent can edit them."""
    if os.geteuid() != 0:
        return
    st = os.fstat(dir_fd)
    with contextlib.suppress(OSError):
        os.chown(name, st.st_uid, st.st_gid, dir_fd=dir_fd, follow_symlinks=False)


def read_workspace_file(root: Path, relpath: str, max_bytes: int) -> bytes:
    """Read a regular file of the workspace, refusing links, special files and files over max_bytes."""
    parts = split_relpath(relpath)
    if not parts:
        raise WorkspacePathRefused("a file path is required")
    with _walk_to_parent(root, parts, relpath) as parent:
        try:
            fd = os.open(parts[-1], _READ_FLAGS, dir_fd=parent)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise WorkspacePathRefused(f"{relpath!r} is a symlink") from exc
            raise
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise WorkspacePathRefused(f"{relpath!r} is not a regular file")
            if st.st_size > max_bytes:
                raise WorkspaceFileTooLarge(f"{relpath!r} is {st.st_size} bytes, over the cap of {max_bytes}")
            os.set_blocking(fd, True)
            chunks: list[bytes] = []
            total = 0
            # The file can grow after fstat (the agent is still running): read at most cap + 1.
            while total <= max_bytes:
                chunk = os.read(fd, min(1024 * 1024, max_bytes + 1 - total))
                if not chunk:
                    break
                chunks.append(chunk)
                total += len(chunk)
            if total > max_bytes:
                raise WorkspaceFileTooLarge(f"{relpath!r} grew over the cap of {max_bytes} bytes")
            return b"".join(chunks)
        finally:
            os.close(fd)


def write_workspace_file(root: Path, relpath: str, data: bytes, max_bytes: int) -> None:
    """Write a file into the workspace (creating parent directories), never through a link.

    The data goes to a fresh temporary file that is then renamed over the target: rename replaces a
    symlink itself instead of following it, and a reader never sees half a file.
    """
    if len(data) > max_bytes:
        raise WorkspaceFileTooLarge(f"{len(data)} bytes is over the cap of {max_bytes}")
    parts = split_relpath(relpath)
    if not parts:
        raise WorkspacePathRefused("a file path is required")
    name = parts[-1]
    with _walk_to_parent(root, parts, relpath, create=True) as parent:
        try:
            existing = os.stat(name, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            existing = None
        if existing is not None and stat.S_ISDIR(existing.st_mode):
            raise WorkspacePathRefused(f"{relpath!r} is a directory")
        tmp = f".{name[:200]}.forgehand-{os.getpid()}-{os.urandom(4).hex()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=parent)
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
            finally:
                os.close(fd)
            _give_to_owner_at(parent, tmp)
            os.rename(tmp, name, src_dir_fd=parent, dst_dir_fd=parent)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=parent)
            raise


def list_workspace(root: Path, relpath: str = "", *, max_entries: int = 10_000) -> list[WorkspaceEntry]:
    """List a workspace directory without following links (links are reported, not resolved)."""
    parts = split_relpath(relpath)
    # Walking to the "parent" of a dummy last component lands on the directory itself.
    with _walk_to_parent(root, [*parts, "."], relpath) as directory:
        entries: list[WorkspaceEntry] = []
        with os.scandir(directory) as it:  # scandir duplicates the fd
            for entry in it:
                if len(entries) >= max_entries:
                    break
                st = entry.stat(follow_symlinks=False)
                kind: EntryKind
                if stat.S_ISLNK(st.st_mode):
                    kind = "symlink"
                elif stat.S_ISDIR(st.st_mode):
                    kind = "dir"
                elif stat.S_ISREG(st.st_mode):
                    kind = "file"
                else:
                    kind = "other"
                entries.append(WorkspaceEntry(entry.name, kind, st.st_size if kind == "file" else 0))
        return sorted(entries, key=lambda e: e.name)
