"""Fencing a run's git writes against a worker that lost its lease.

A worker that stalls (frozen, cut off) past its lease loses its run to another worker, which
snapshots the workspace and ends the run. The stalled worker may wake at any instant, including
between checking that it still owns the run and moving the task branch; a check in the database
cannot close that gap, because the branch lives in git. So the check is made where the write is:

- the run's worker *holds* a fence ref, ``refs/forgehand/runs/<run uuid>`` pointing at a blob that
  says "held", before its first git write (`hold`; refused if the fence is there already);
- its snapshot moves the branch only in a git transaction that locks the fence ref first and
  finds it still held (`forge.git.bare.update_ref(fence=...)`, raising `Fenced` otherwise);
- a worker taking the run over *revokes* the fence (points it at a "revoked" blob, under the
  same lock) before it snapshots or records anything (`revoke`), and never deletes it;
- the run's own end removes a fence it still holds (`release`).

git's ref lock makes the transaction and the revocation exclusive: the stalled worker's branch
move either happened before the revocation (the taker then reads it as the branch's tip) or is
refused after it. A fence's lock is never taken for a dead writer's before `STALE_SECONDS`, nor
by the periodic sweep of ref locks. Fence refs are hidden from fetch and push (``transfer.hideRefs``, see
`forge.git.smart_http`). A revoked fence stays: removing it would let a worker that wakes later
hold it again. It costs one small ref per run that was taken over."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Final

import pygit2
from pygit2.transaction import ReferenceTransaction

from forge.git import ref_locks
from forge.git.errors import Fenced, RefConflict

NAMESPACE: Final = "refs/forgehand/runs/"
#: How long `revoke` waits for a fence locked by its holder's transaction (held for milliseconds).
LOCK_TIMEOUT: Final = 2.0
#: A fence lock older than this is taken for a dead writer's and removed by `revoke`. Not git's
#: 10 s (`ref_locks.STALE_SECONDS`): the holder of a fence is a worker whose lease lapsed, perhaps
#: frozen inside its transaction rather than dead, and removing its lock early would let it move
#: the branch when it wakes. Until then the run is recovered at a later pass; a dead writer's lock
#: costs that delay.
STALE_SECONDS: Final = 300.0


def fence_ref(run_uuid: str) -> str:
    if not run_uuid or not all(c.isalnum() or c == "-" for c in run_uuid):
        raise ValueError(f"not a run id: {run_uuid!r}")
    return NAMESPACE + run_uuid


def _held(run_uuid: str) -> bytes:
    return f"held: run {run_uuid}\n".encode()


def held_id(run_uuid: str) -> pygit2.Oid:
    """The id of the blob a held fence points at: computed, never written (only `hold` writes it)."""
    return pygit2.hash(_held(run_uuid))


def _revoked(run_uuid: str) -> bytes:
    return f"revoked: run {run_uuid} was taken over\n".encode()


def _target(repo: pygit2.Repository, ref: str) -> pygit2.Oid | None:
    reference = repo.references.get(ref)
    target = reference.target if reference is not None else None
    return target if isinstance(target, pygit2.Oid) else None


def hold(repo: pygit2.Repository, run_uuid: str) -> None:
    """Make the run's fence, held. Raises `Fenced` if it exists and is not held (revoked: the run
    was taken over before its worker got here)."""
    ref = fence_ref(run_uuid)
    held = repo.create_blob(_held(run_uuid))
    with repo.transaction() as txn:
        txn.lock_ref(ref)
        current = _target(repo, ref)
        if current == held:
            return
        if current is not None:
            raise Fenced(run_uuid)
        txn.set_target(ref, held, message="fence: held by the run's worker")


def check_held(repo: pygit2.Repository, txn: ReferenceTransaction, run_uuid: str) -> None:
    """Inside a ref transaction: lock the run's fence (first, before any ref it guards) and raise
    `Fenced` unless it is held. The lock is kept until the transaction ends."""
    ref = fence_ref(run_uuid)
    txn.lock_ref(ref)
    if _target(repo, ref) != held_id(run_uuid):
        raise Fenced(run_uuid)


def revoke(repo: pygit2.Repository, run_uuid: str, *, lock_timeout: float = LOCK_TIMEOUT) -> None:
    """Revoke the run's fence (made revoked if missing). Waits while its holder's transaction has
    it locked; a lock older than `STALE_SECONDS` is a dead writer's and is removed. Raises
    `RefConflict` if the lock stayed taken."""
    ref = fence_ref(run_uuid)
    revoked = repo.create_blob(_revoked(run_uuid))
    deadline = time.monotonic() + lock_timeout
    delay = 0.005
    while True:
        try:
            with repo.transaction() as txn:
                txn.lock_ref(ref)
                if _target(repo, ref) != revoked:
                    txn.set_target(ref, revoked, message="fence: revoked, the run was taken over")
            return
        except (pygit2.GitError, OSError) as exc:
            if ref_locks.remove_if_stale(Path(repo.path) / f"{ref}.lock", older_than_seconds=STALE_SECONDS):
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RefConflict(f"the fence of run {run_uuid} stayed locked; try again") from exc
            time.sleep(min(delay, remaining))
            delay = min(delay * 2, 0.1)


def release(repo: pygit2.Repository, run_uuid: str) -> None:
    """The run's end: remove its fence if it is still held (a revoked fence stays)."""
    ref = fence_ref(run_uuid)
    with repo.transaction() as txn:
        txn.lock_ref(ref)
        if _target(repo, ref) == held_id(run_uuid):
            txn.remove(ref)


def state(repo: pygit2.Repository, run_uuid: str) -> str:
    """`held`, `revoked` or `none`: what the run's fence says (for tests and diagnostics)."""
    current = _target(repo, fence_ref(run_uuid))
    if current is None:
        return "none"
    return "held" if current == held_id(run_uuid) else "revoked"
