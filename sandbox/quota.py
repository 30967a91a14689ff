"""The workspace quota: each run's workspace is its own small filesystem, so a disk filler stops at its size.

The mechanism is a sparse ext4 image file beside the workspace directory, loop-mounted on it by the
host before the sandbox starts. Why this one:
- the kernel enforces it: a write past the size fails with ENOSPC inside the sandbox (and on the host,
  for files the host writes there), however fast the writer; the sparse image, the only thing on the
  host's disk, grows by at most the limit;
- it needs nothing but root and a loop device: no quota-enabled filesystem (a project quota needs the
  data dir's filesystem mounted with `prjquota`), no storage driver with size options (Docker's
  volume and overlay2 size options need xfs with `pquota`), no RAM (a host tmpfs of the same size
  would hold the work tree in memory and be gone after a reboot);
- the mount lives in the kernel, not in our process: it survives a crash of forgehand, so recovery
  can still read the work tree and snapshot it; `unmount_quota` is part of the workspace's cleanup;
- the host reads the work tree through the same mount after the container is gone.
Without root (or without a loop device) `mount_quota` raises `WorkspaceQuotaUnavailable`; the
documented fallback is the watchdog (`workspace_usage` on a plain directory against
`Limits.workspace_bytes`), which ends the run at the limit but cannot stop a burst: a fast writer
passes the limit by whatever it writes between two looks.
"""

import asyncio
import contextlib
import os
import re
import shutil
import stat
import subprocess
import time
from pathlib import Path
from typing import Literal

import msgspec

from .errors import WorkspaceQuotaUnavailable

MiB = 1024 * 1024
MIN_QUOTA_BYTES = 16 * MiB  # below this, ext4's own metadata is most of the filesystem
_COMMAND_TIMEOUT = 60.0
IMAGE_SUFFIX = ".img"

QuotaKind = Literal["mount", "watchdog"]


class WorkspaceUsage(msgspec.Struct, frozen=True, kw_only=True):
    """How full a workspace is, and what enforces its limit."""

    enforced_by: QuotaKind
    limit_bytes: int  # the filesystem's usable size (mount) or Limits.workspace_bytes (watchdog)
    used_bytes: int
    free_bytes: int
    files_free: int | None = None  # free inodes (mount only): a million empty files fill it too

    @property
    def full(self) -> bool:
        """At the limit: what a writer gets next is ENOSPC (mount) or past the limit (watchdog)."""
        if self.enforced_by == "watchdog":
            return self.used_bytes >= self.limit_bytes
        # ext4 keeps a few hundred KiB it never hands out; "full" is a little before the last block.
        return self.free_bytes < full_margin(self.limit_bytes) or self.files_free == 0


def full_margin(limit_bytes: int) -> int:
    return max(MiB, limit_bytes // 200)


def image_path(workspace: Path) -> Path:
    """Where the image of a workspace lives: beside it, never inside what the agent can reach."""
    return workspace.with_name(workspace.name + IMAGE_SUFFIX)


def quota_unavailable_reason() -> str | None:
    """Why `mount_quota` cannot work on this host (None when it can): root, tools, a loop device."""
    if os.geteuid() != 0:
        return "mounting a size-limited workspace needs root (CAP_SYS_ADMIN); forgehand runs as uid " + str(
            os.geteuid()
        )
    for tool in ("mkfs.ext4", "mount", "umount"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (Debian: e2fsprogs, mount)"
    if not Path("/dev/loop-control").exists():
        return "no loop devices on this host (/dev/loop-control is missing)"
    return None


def is_mounted(path: Path) -> bool:
    return os.path.ismount(path)


def _run(argv: list[str]) -> None:
    try:
        # C locale: the messages are read (`_mount_loop`) and shown as the tools wrote them.
        env = {**os.environ, "LC_ALL": "C"}
        done = subprocess.run(argv, capture_output=True, timeout=_COMMAND_TIMEOUT, check=False, env=env)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise WorkspaceQuotaUnavailable(f"{argv[0]} failed: {exc}") from exc
    if done.returncode != 0:
        err = done.stderr.decode(errors="replace").strip()[-500:]
        raise WorkspaceQuotaUnavailable(f"{argv[0]} exited {done.returncode}: {err}")


def mount_quota(workspace: Path, limit_bytes: int, *, owner: tuple[int, int]) -> Path:
    """Mount a fresh `limit_bytes` ext4 filesystem on the (empty) directory `workspace`; return its image.

    Idempotent: a workspace already mounted stays as it is, and an image left from before a reboot is
    mounted again as it is (never reformatted: it holds a work tree recovery has not read yet).
    """
    if limit_bytes < MIN_QUOTA_BYTES:
        raise ValueError(f"a workspace quota must be at least {MIN_QUOTA_BYTES} bytes, got {limit_bytes}")
    reason = quota_unavailable_reason()
    if reason is not None:
        raise WorkspaceQuotaUnavailable(reason)
    image = image_path(workspace)
    if is_mounted(workspace):
        return image
    created = False
    if not image.exists():
        fd = os.open(image, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        created = True
        try:
            os.ftruncate(fd, limit_bytes)  # sparse: blocks are taken as the agent writes, up to the size
        finally:
            os.close(fd)
    try:
        if created:
            uid, gid = owner
            # No reserved blocks (the agent is not root); 8 KiB per inode, twice the default's files;
            # a small journal, so a host crash leaves a filesystem recovery can mount; no discard pass.
            _run(
                [
                    "mkfs.ext4",
                    "-q",
                    "-F",
                    "-m",
                    "0",
                    "-b",
                    "4096",
                    "-i",
                    "8192",
                    "-J",
                    "size=4",
                    "-L",
                    "forgehand-ws",
                    "-E",
                    f"root_owner={uid}:{gid},lazy_itable_init=1,lazy_journal_init=1,nodiscard",
                    str(image),
                ]
            )
        _mount_loop(image, workspace)
    except BaseException:
        if created:
            with contextlib.suppress(OSError):
                image.unlink()
        raise
    if created:
        with contextlib.suppress(OSError):
            (workspace / "lost+found").rmdir()  # not the agent's; e2fsck makes it again if it needs one
    return image


#: `mount -o loop` can lose the race for a free loop device to another mount or to a loop device
#: being let go (several runs or workers mounting and unmounting at once on one host: "failed to
#: setup loop device", seen 1 in about 100 runs with two workers of 3 runs each on one host). It
#: is tried again after each of these pauses before the workspace fails.
LOOP_RETRY_PAUSES = (0.1, 0.3, 1.0)


def _mount_loop(image: Path, workspace: Path) -> None:
    for pause in (*LOOP_RETRY_PAUSES, None):
        try:
            # `-o loop` sets autoclear: the loop device goes away with the last unmount.
            _run(["mount", "-t", "ext4", "-o", "loop,nosuid,nodev,noatime", str(image), str(workspace)])
            return
        except WorkspaceQuotaUnavailable as exc:
            if pause is None or "failed to setup loop device" not in str(exc) or is_mounted(workspace):
                raise
            time.sleep(pause)


def unmount_quota(workspace: Path) -> None:
    """Unmount the workspace's filesystem (if mounted) and delete its image. Idempotent."""
    if is_mounted(workspace):
        try:
            _run(["umount", str(workspace)])
        except WorkspaceQuotaUnavailable:
            # Still busy (a process of a container not quite gone): detach now, freed when it lets go.
            _run(["umount", "-l", str(workspace)])
    with contextlib.suppress(FileNotFoundError):
        image_path(workspace).unlink()


def move_quota_mount(slot: Path, target: Path) -> None:
    """Bind the filesystem mounted at `slot` at the empty directory `target`, let the slot's mount
    go and move its image beside `target` (same filesystem): `target` is that workspace now."""
    if is_mounted(target):
        raise WorkspaceQuotaUnavailable(f"{target} is already a mount point")
    target.mkdir(exist_ok=True)
    if any(target.iterdir()):
        raise WorkspaceQuotaUnavailable(f"{target} is not empty")
    _run(["mount", "--bind", str(slot), str(target)])
    try:
        image_path(slot).rename(image_path(target))
    except OSError:
        _run(["umount", str(target)])
        raise
    try:
        _run(["umount", str(slot)])
    except WorkspaceQuotaUnavailable:
        _run(["umount", "-l", str(slot)])
    slot.rmdir()


def quota_mounts(under: Path, *, mountinfo: str | None = None) -> list[Path]:
    """Quota workspaces mounted below `under` (e.g. left by a crash, for recovery), from mountinfo."""
    if mountinfo is None:
        mountinfo = Path("/proc/self/mountinfo").read_text(encoding="utf-8", errors="surrogateescape")
    root = str(under.resolve())  # the kernel lists real paths
    found: list[Path] = []
    for line in mountinfo.splitlines():
        fields = line.split()
        if len(fields) < 5 or "-" not in fields:
            continue
        fstype, source = [*fields[fields.index("-") + 1 :], "", ""][:2]
        # The kernel writes a space in a path as \040, a tab \011, a newline \012, a backslash \134.
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
        if fstype == "ext4" and source.startswith("/dev/loop") and point.startswith(root + os.sep):
            found.append(Path(point))
    return found


def workspace_usage(workspace: Path, limit_bytes: int, *, time_budget: float = 5.0) -> WorkspaceUsage:
    """How full `workspace` is: its own filesystem when it is a quota mount, else a walk of the tree."""
    if is_mounted(workspace):
        st = os.statvfs(workspace)
        total = st.f_blocks * st.f_frsize
        free = st.f_bavail * st.f_frsize
        return WorkspaceUsage(
            enforced_by="mount",
            limit_bytes=total,
            used_bytes=total - st.f_bfree * st.f_frsize,
            free_bytes=free,
            files_free=st.f_favail,
        )
    used = tree_bytes(workspace, deadline=time.monotonic() + time_budget)
    return WorkspaceUsage(
        enforced_by="watchdog", limit_bytes=limit_bytes, used_bytes=used, free_bytes=max(0, limit_bytes - used)
    )


def tree_bytes(root: Path, *, deadline: float) -> int:
    """Disk blocks under `root` (each inode once, links not followed); a partial sum past the deadline."""
    seen: set[tuple[int, int]] = set()
    total = 0
    stack = [str(root)]
    while stack and time.monotonic() < deadline:
        try:
            with os.scandir(stack.pop()) as it:
                for entry in it:
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue  # gone meanwhile
                    key = (st.st_dev, st.st_ino)
                    if key in seen:
                        continue
                    seen.add(key)
                    total += st.st_blocks * 512
                    if stat.S_ISDIR(st.st_mode):
                        stack.append(entry.path)
        except OSError:
            continue
    return total


class WorkspaceWatch:
    """Looks at a sandbox's workspace while it lives; `limit_reached` stays true once it was seen full.

    On a quota mount the kernel already refused the write; the watch only tells the host, so the run
    ends `disk_limit` instead of going on with a full disk. On a plain directory it is the watchdog.
    """

    MOUNT_INTERVAL = 0.25  # one statvfs
    WATCHDOG_INTERVAL = 2.0  # a walk of the tree; slower trees are looked at less often

    def __init__(self, workspace: Path, limit_bytes: int) -> None:
        self.workspace = workspace
        self.limit_bytes = limit_bytes
        self.enforced_by: QuotaKind = "mount" if is_mounted(workspace) else "watchdog"
        self.last: WorkspaceUsage | None = None
        self.limit_reached = False
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._watch())

    def stop(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()

    async def check(self) -> bool:
        """Measure now; True when the workspace is (or was) at its limit."""
        usage = await asyncio.to_thread(workspace_usage, self.workspace, self.limit_bytes)
        self.last = usage
        if usage.full:
            self.limit_reached = True
        return self.limit_reached

    async def _watch(self) -> None:
        while not self.limit_reached:
            t0 = time.monotonic()
            with contextlib.suppress(OSError):  # the workspace went away: nothing left to fill
                await self.check()
            if self.enforced_by == "mount":
                await asyncio.sleep(self.MOUNT_INTERVAL)
            else:
                await asyncio.sleep(max(self.WATCHDOG_INTERVAL, 5 * (time.monotonic() - t0)))
