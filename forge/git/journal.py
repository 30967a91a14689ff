"""The push intent journal: git and the database are two stores, so every push is written down
(fsynced) before receive-pack may move a ref, and crossed out only once the database holds its
record. Whatever crashes in between, a leftover entry says which refs to look at.

One entry is one JSON file `<id>.json` under the journal directory; the post-receive hook appends
the updates git applied to `<id>.accepted` beside it (`FORGEHAND_PUSH_LOG`). `outcome` tells what
actually happened from both: the accepted log, or, when git died before post-receive, the refs.

Also here: the sweep of quarantine directories (`objects/incoming-*`, `objects/tmp_objdir-*`)
left by pushes that were interrupted. Framework-free, database-free; blocking (call in a thread)."""

import contextlib
import os
import shutil
import socket
import time
import uuid
from pathlib import Path

import msgspec
import pygit2

from forge.git.bare import open_repo
from forge.git.refrules import RefUpdate

ZERO = "0" * 40
QUARANTINE_PREFIXES = ("incoming-", "tmp_objdir-")


class JournalEntry(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    repo_path: str
    updates: list[RefUpdate]  # as the client asked
    before: dict[str, str]  # each ref's value when the entry was written ("" if missing)
    created: float  # time.time()
    owner: str  # "host:pid" of the server process that runs the push
    meta: msgspec.Raw = msgspec.Raw(b"null")  # the host's own record of who pushed (opaque here)


_decoder = msgspec.json.Decoder(JournalEntry)
_update_decoder = msgspec.json.Decoder(RefUpdate)


def _owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _ref_values(repo_path: Path, refs: list[str]) -> dict[str, str]:
    repo = open_repo(repo_path)
    try:
        out = {}
        for ref in refs:
            try:
                found = repo.references.get(ref)
            except (pygit2.GitError, ValueError):
                found = None
            out[ref] = str(found.resolve().target) if found is not None else ""
        return out
    finally:
        repo.free()


class PushJournal:
    def __init__(self, root: Path) -> None:
        # Absolute: the post-receive hook writes `<id>.accepted` from inside the bare repository.
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)

    def _entry_path(self, entry_id: str) -> Path:
        return self.root / f"{entry_id}.json"

    def accepted_path(self, entry_id: str) -> Path:
        return self.root / f"{entry_id}.accepted"

    def begin(self, repo_path: Path, updates: list[RefUpdate], meta: bytes) -> JournalEntry:
        """Write the intent durably (file and directory fsynced) and return it. Call before git runs."""
        entry = JournalEntry(
            id=str(uuid.uuid4()),
            repo_path=str(repo_path),
            updates=updates,
            before=_ref_values(repo_path, [u.ref for u in updates]),
            created=time.time(),
            owner=_owner(),
            meta=msgspec.Raw(meta),
        )
        path = self._entry_path(entry.id)
        tmp = path.with_suffix(".tmp")
        with tmp.open("wb") as fh:
            fh.write(msgspec.json.encode(entry))
            fh.flush()
            os.fsync(fh.fileno())
        tmp.replace(path)
        _fsync_dir(self.root)
        return entry

    def entries(self) -> list[JournalEntry]:
        """Every leftover entry, oldest first (unreadable ones are left for a person to look at)."""
        out = []
        for path in self.root.glob("*.json"):
            with contextlib.suppress(OSError, msgspec.DecodeError, msgspec.ValidationError):
                out.append(_decoder.decode(path.read_bytes()))
        return sorted(out, key=lambda e: e.created)

    def outcome(self, entry: JournalEntry) -> list[RefUpdate]:
        """The updates of `entry` that git applied: in the accepted log, or seen on the refs (a ref
        now at the new value that was not there before; a deleted ref now missing)."""
        accepted: dict[str, RefUpdate] = {}
        with contextlib.suppress(FileNotFoundError):
            for line in self.accepted_path(entry.id).read_bytes().splitlines():
                with contextlib.suppress(msgspec.DecodeError, msgspec.ValidationError):
                    update = _update_decoder.decode(line)
                    accepted[update.ref] = update
        if not Path(entry.repo_path).exists():
            return list(accepted.values())
        now = _ref_values(Path(entry.repo_path), [u.ref for u in entry.updates])
        applied = []
        for update in entry.updates:
            if update.ref in accepted:
                applied.append(accepted[update.ref])
                continue
            new = "" if update.new == ZERO else update.new
            before = entry.before.get(update.ref, "")
            if now.get(update.ref, "") == new and before != new:
                applied.append(RefUpdate(old=before or ZERO, new=update.new, ref=update.ref))
        return applied

    def is_stale(self, entry: JournalEntry, *, grace_seconds: float) -> bool:
        """Whether no live process can still be running this push: its owner on this host is gone,
        or (owner elsewhere, or a reused pid) it is older than the grace period."""
        if time.time() - entry.created > grace_seconds:
            return True
        host, _, pid = entry.owner.rpartition(":")
        if host != socket.gethostname() or not pid.isdigit():
            return False
        if int(pid) == os.getpid():
            return True  # ours: the caller skips the pushes it is still running
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False

    def finish(self, entry_id: str) -> None:
        """Cross the entry out (its push is recorded, or nothing happened)."""
        self.accepted_path(entry_id).unlink(missing_ok=True)
        self._entry_path(entry_id).unlink(missing_ok=True)
        _fsync_dir(self.root)


def _newest_mtime(directory: Path) -> float:
    """The last write under `directory` (a pack still being received keeps it fresh)."""
    newest = directory.lstat().st_mtime
    for root, _dirs, files in os.walk(directory):
        for name in files:
            with contextlib.suppress(OSError):
                newest = max(newest, (Path(root) / name).lstat().st_mtime)
    return newest


def sweep_quarantines(repos_root: Path, *, older_than_seconds: float) -> list[Path]:
    """Remove the quarantine directories of interrupted pushes older than the grace period (a live
    push's quarantine is younger: it is never touched). Returns what was removed."""
    removed = []
    limit = time.time() - older_than_seconds
    for objects in Path(repos_root).glob("*/*/objects"):
        with contextlib.suppress(OSError):
            for child in objects.iterdir():
                quarantine = child.name.startswith(QUARANTINE_PREFIXES) and child.is_dir() and not child.is_symlink()
                if quarantine and _newest_mtime(child) < limit:
                    shutil.rmtree(child, ignore_errors=True)
                    removed.append(child)
    return removed
