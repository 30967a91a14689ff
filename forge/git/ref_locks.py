"""Ref lock files a dead writer left behind.

git and libgit2 update a ref by creating `<ref>.lock` exclusively, writing the new value and
renaming it over the ref: a lock is held for milliseconds. A process killed in between (SIGKILL,
the machine going down) cannot remove it, and then every later update of that ref fails ("being
updated by someone else", `cannot lock ref`) until someone deletes the file by hand. A lock file
older than `STALE_SECONDS` is such a leftover: forgehand removes it when a merge meets it and when
the push journal is reconciled (at start and every few minutes)."""

import contextlib
import time
from pathlib import Path
from typing import Final

import structlog

log = structlog.get_logger("forgehand.git")

#: Far beyond what any live update holds a ref lock for.
STALE_SECONDS: Final = 10.0


def remove_if_stale(lock: Path, *, older_than_seconds: float = STALE_SECONDS) -> bool:
    """Remove `lock` if it is older than the limit. True if it is gone now (removed, or let go
    meanwhile), False if a live writer may still hold it."""
    try:
        age = time.time() - lock.stat().st_mtime
    except FileNotFoundError:
        return True
    except OSError:
        return False
    if age < older_than_seconds:
        return False
    try:
        lock.unlink()
    except FileNotFoundError:
        return True
    except OSError:
        return False
    log.warning("removed a stale ref lock", lock=str(lock), age_seconds=round(age, 1))
    return True


def sweep(repos_root: Path, *, older_than_seconds: float = STALE_SECONDS) -> list[Path]:
    """Remove the stale ref locks (`refs/**.lock`, `packed-refs.lock`) of every repository under
    `repos_root` (`<owner>/<name>` directories). Returns what was removed."""
    removed = []
    for repo in Path(repos_root).glob("*/*"):
        candidates = [repo / "packed-refs.lock"]
        # Not the runs' fences (refs/forgehand/, forge.git.fences): one of those locked for long is
        # as likely a frozen worker's as a dead one's, and revoking the fence decides that itself.
        fences = repo / "refs" / "forgehand"
        with contextlib.suppress(OSError):
            candidates += [
                p
                for p in (repo / "refs").rglob("*.lock")
                if p.is_file() and not p.is_symlink() and fences not in p.parents
            ]
        for lock in candidates:
            if lock.exists() and remove_if_stale(lock, older_than_seconds=older_than_seconds):
                removed.append(lock)
    return removed
