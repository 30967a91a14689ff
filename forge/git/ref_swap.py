"""Moving a branch by compare-and-swap under git's own ref lock (``refs/heads/<branch>.lock``, the
file ``git receive-pack`` locks too): a concurrent push or merge is never overwritten, the loser
gets ``BaseMoved`` and nothing changes. A lock a dead writer left behind is removed
(``ref_locks``)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Final

import pygit2

from forge.git import ref_locks
from forge.git.errors import BaseMoved, RefConflict
from forge.git.names import validate_branch_name
from forge.git.schemas import Identity

#: How long to wait for a ref lock held by someone else (git's own default is 100 ms).
DEFAULT_LOCK_TIMEOUT: Final = 2.0


def swap_branch(
    repo: pygit2.Repository,
    branch: str,
    *,
    old: str,
    new: str,
    reflog_message: str,
    reflog_identity: Identity | None = None,
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
) -> None:
    """Move ``refs/heads/<branch>`` from ``old`` to ``new`` if and only if it is at ``old``.

    Takes git's lock file on the ref (libgit2 creates ``<ref>.lock`` exclusively, as git does),
    reads the ref while holding it, compares, writes the new value and the reflog, and releases
    the lock. While someone else holds the lock and the ref has not moved yet, retries until
    ``lock_timeout``. Raises ``BaseMoved`` if the ref is elsewhere, ``RefConflict`` if the lock
    stayed taken.

    (``Reference.set_target`` on a reference loaded earlier compares too, but a held lock and a
    moved ref then surface as the same kind of exception; ``references.create(force=True)`` does
    not compare at all and would overwrite a concurrent push.)
    """
    validate_branch_name(branch)
    ref = f"refs/heads/{branch}"
    deadline = time.monotonic() + lock_timeout
    delay = 0.005
    # The reflog entry is signed with the repository's identity (pygit2 1.21's transaction cannot
    # take a signature itself): make it the committer, and put the caller's object back after.
    saved_ident = repo.ident
    if reflog_identity is not None:
        repo.set_ident(reflog_identity.name, reflog_identity.email)
    try:
        while True:
            try:
                with repo.transaction() as txn:
                    try:
                        txn.lock_ref(ref)
                    except (pygit2.GitError, OSError) as exc:
                        raise _RefLocked from exc
                    # Read under our lock: no git writer can change the ref until we let go.
                    current = branch_target(repo, ref)
                    if current != old:
                        raise BaseMoved(old, current, branch=branch)
                    txn.set_target(ref, new, message=reflog_message)
                return  # leaving the block committed the transaction
            except _RefLocked as locked:
                # Someone else is updating the ref. If it already moved we lost; if not, wait.
                current = branch_target(repo, ref)
                if current != old:
                    raise BaseMoved(old, current, branch=branch) from None
                if ref_locks.remove_if_stale(Path(repo.path) / f"{ref}.lock"):  # a dead writer's
                    continue
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise RefConflict(f"{ref} is locked by another update; try again") from locked.__cause__
                time.sleep(min(delay, remaining))
                delay = min(delay * 2, 0.1)
    finally:
        repo.set_ident(*saved_ident)


class _RefLocked(Exception):
    """Another writer holds the ref's lock file."""


def branch_target(repo: pygit2.Repository, ref: str) -> str | None:
    reference = repo.references.get(ref)
    if reference is None:
        return None
    target = reference.target
    return str(target) if isinstance(target, pygit2.Oid) else None
