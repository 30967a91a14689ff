"""Merging a head commit into a base branch: plan (read) and merge (write), no work tree.

The merge is computed by libgit2 in memory (``Repository.merge_commits``: recursive merge base,
rename detection) and never touches a work tree. The base branch moves by compare-and-swap
against the commit the merge was computed from, under git's own ref lock (``ref_swap``), so a
concurrent push or merge is never overwritten: the loser gets ``BaseMoved`` and nothing changes.
Conflicts are read off the merged index by ``conflicts``.

"ours" is the base branch, "theirs" the head commit, as in ``git merge`` run on the base branch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

import msgspec
import pygit2

from forge.git.conflicts import merged_conflicts
from forge.git.errors import (
    BaseMoved,
    MergeConflicts,
    NotFastForward,
    NothingToMerge,
    RefNotFound,
    UnrelatedHistories,
)
from forge.git.names import validate_branch_name
from forge.git.ref_swap import DEFAULT_LOCK_TIMEOUT, branch_target, swap_branch
from forge.git.schemas import Identity, MergeConflictFile

MergeStrategy = Literal["merge", "squash", "fast-forward"]
#: Why a plan cannot be carried out: the ``code`` of the error ``merge`` would raise.
MergeBlocker = Literal["merge_conflict", "not_fast_forward", "nothing_to_merge", "unrelated_histories"]

_FULL_SHA_RE = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}", re.ASCII)


class MergePlan(msgspec.Struct, frozen=True, kw_only=True):
    base_branch: str
    #: The tip of the base branch the plan was computed against.
    base_sha: str
    head_sha: str
    #: ``None`` when the two histories share no commit.
    merge_base: str | None
    strategy: MergeStrategy
    #: The base tip is an ancestor of the head (and not the head itself).
    fast_forward_possible: bool
    #: The head is already contained in the base branch.
    up_to_date: bool
    conflicts: list[MergeConflictFile]
    mergeable: bool
    blocker: MergeBlocker | None = None


class MergeResult(msgspec.Struct, frozen=True, kw_only=True):
    strategy: MergeStrategy
    old_base_sha: str
    #: The new tip of the base branch: the merge or squash commit, or the head for a fast-forward.
    new_base_sha: str
    head_sha: str


@dataclass(frozen=True, slots=True)
class _Analysis:
    plan: MergePlan
    #: The merged index when a real three-way merge was needed, else ``None``.
    index: pygit2.Index | None
    #: The merged tree when no three-way merge was needed (the head's tree).
    tree_id: pygit2.Oid | None


def plan_merge(repo: pygit2.Repository, base_branch: str, head_sha: str, strategy: MergeStrategy) -> MergePlan:
    """What merging ``head_sha`` into ``base_branch`` with ``strategy`` would do.

    Moves no ref. (libgit2 stores the blobs of files it merged line by line in the object
    database, unreferenced until a merge commits them; ``git gc`` prunes them otherwise.)
    """
    return _analyse(repo, base_branch, head_sha, strategy).plan


def merge(
    repo: pygit2.Repository,
    *,
    base_branch: str,
    head_sha: str,
    strategy: MergeStrategy,
    expected_base_sha: str | None,
    author: Identity,
    committer: Identity | None = None,
    message: str,
    when: datetime | None = None,
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
) -> MergeResult:
    """Merge ``head_sha`` (a full commit id) into ``base_branch``: a merge commit (parents base and head), a squash
    commit (parent base) or a fast-forward. ``message`` is the commit message (the reflog's for a
    fast-forward); ``committer`` defaults to ``author``, ``when`` to now.

    Raises before anything moves: ``RefNotFound`` (no such branch, or ``head_sha`` is not a
    commit here), ``BaseMoved`` (``expected_base_sha`` is not the tip, or the branch moved while
    the merge was computed), ``MergeConflicts``, ``NotFastForward``, ``NothingToMerge``,
    ``UnrelatedHistories``; ``RefConflict`` when another writer held the branch's lock for longer
    than ``lock_timeout`` seconds.
    """
    analysis = _analyse(repo, base_branch, head_sha, strategy)
    plan = analysis.plan
    if expected_base_sha is not None and expected_base_sha.lower() != plan.base_sha:
        raise BaseMoved(expected_base_sha, plan.base_sha, branch=base_branch)
    _raise_blocker(plan)
    committer = committer or author
    summary = message.strip().split("\n", 1)[0]
    if strategy == "fast-forward":
        new_sha = plan.head_sha
        reflog = f"forgehand merge {plan.head_sha}: fast-forward"
    else:
        tree_id = analysis.index.write_tree(repo) if analysis.index is not None else analysis.tree_id
        assert tree_id is not None
        parents = [pygit2.Oid(hex=plan.base_sha)]
        if strategy == "merge":
            parents.append(pygit2.Oid(hex=plan.head_sha))
        commit_id = repo.create_commit(
            None, _signature(author, when), _signature(committer, when), message, tree_id, parents
        )
        new_sha = str(commit_id)
        reflog = f"forgehand merge {plan.head_sha} ({strategy}): {summary}"
    swap_branch(
        repo,
        base_branch,
        old=plan.base_sha,
        new=new_sha,
        reflog_message=reflog,
        reflog_identity=committer,
        lock_timeout=lock_timeout,
    )
    return MergeResult(strategy=strategy, old_base_sha=plan.base_sha, new_base_sha=new_sha, head_sha=plan.head_sha)


def _analyse(repo: pygit2.Repository, base_branch: str, head_sha: str, strategy: MergeStrategy) -> _Analysis:
    if strategy not in ("merge", "squash", "fast-forward"):
        raise ValueError(f"unknown merge strategy {strategy!r}")
    validate_branch_name(base_branch)
    base_ref = f"refs/heads/{base_branch}"
    base_sha = branch_target(repo, base_ref)
    if base_sha is None:
        raise RefNotFound(f"branch {base_branch!r} does not exist")
    base = _commit(repo, base_sha)
    if base is None:
        raise RefNotFound(f"branch {base_branch!r} does not point at a commit")
    head = _commit(repo, head_sha.lower()) if _FULL_SHA_RE.fullmatch(head_sha.lower()) else None
    if head is None:
        raise RefNotFound(f"{head_sha!r} is not a commit of this repository")

    merge_base_id = repo.merge_base(base.id, head.id)
    up_to_date = base.id == head.id or merge_base_id == head.id
    ff_possible = not up_to_date and merge_base_id == base.id
    index: pygit2.Index | None = None
    tree_id: pygit2.Oid | None = None
    conflicts: list[MergeConflictFile] = []
    if ff_possible:
        tree_id = head.tree_id  # merging into an ancestor yields the head's tree, no conflict possible
    elif not up_to_date and merge_base_id is not None:
        index = repo.merge_commits(base, head)
        if index.conflicts is not None:
            conflicts = merged_conflicts(repo, index, repo[merge_base_id].peel(pygit2.Commit), base, head)

    blocker: MergeBlocker | None = None
    if up_to_date:
        blocker = "nothing_to_merge"
    elif strategy == "fast-forward":
        blocker = None if ff_possible else "not_fast_forward"
    elif merge_base_id is None:
        blocker = "unrelated_histories"
    elif conflicts:
        blocker = "merge_conflict"
    elif strategy == "squash" and _same_tree(index, tree_id, base.tree):
        blocker = "nothing_to_merge"

    plan = MergePlan(
        base_branch=base_branch,
        base_sha=str(base.id),
        head_sha=str(head.id),
        merge_base=str(merge_base_id) if merge_base_id is not None else None,
        strategy=strategy,
        fast_forward_possible=ff_possible,
        up_to_date=up_to_date,
        conflicts=conflicts,
        mergeable=blocker is None,
        blocker=blocker,
    )
    return _Analysis(plan=plan, index=index, tree_id=tree_id)


def _raise_blocker(plan: MergePlan) -> None:
    short_base, short_head = plan.base_sha[:10], plan.head_sha[:10]
    if plan.blocker == "nothing_to_merge":
        if plan.up_to_date:
            raise NothingToMerge(f"{short_head} is already contained in {plan.base_branch}")
        raise NothingToMerge(f"squashing {short_head} would not change {plan.base_branch}")
    if plan.blocker == "not_fast_forward":
        raise NotFastForward(f"{plan.base_branch} ({short_base}) is not an ancestor of {short_head}")
    if plan.blocker == "unrelated_histories":
        raise UnrelatedHistories(f"{plan.base_branch} and {short_head} share no commit")
    if plan.blocker == "merge_conflict":
        raise MergeConflicts(plan.conflicts)


def _same_tree(index: pygit2.Index | None, tree_id: pygit2.Oid | None, base_tree: pygit2.Tree) -> bool:
    if index is not None:
        # Compared without writing the merged tree: a plan moves nothing and writes no tree.
        return len(index.diff_to_tree(base_tree)) == 0
    return tree_id == base_tree.id


def _commit(repo: pygit2.Repository, sha: str) -> pygit2.Commit | None:
    obj = repo.get(sha)
    return obj if isinstance(obj, pygit2.Commit) else None


def _signature(identity: Identity, when: datetime | None) -> pygit2.Signature:
    if when is None:
        return pygit2.Signature(identity.name, identity.email)
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    offset = when.utcoffset()
    minutes = int(offset.total_seconds() // 60) if offset is not None else 0
    return pygit2.Signature(identity.name, identity.email, int(when.timestamp()), minutes)
