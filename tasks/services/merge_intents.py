"""Merge intents: what makes a merge survive a crash between the base ref's update and the
database commit that records it.

A merge commits a `MergeIntent` row (its own transaction) before the compare-and-swap of the base
ref, and deletes it in the transaction that marks the task `merged`. A row whose merging process
is gone is reconciled (at start and periodically): the base ref carries the merge (the
`Task-Head:` trailer, or the head itself for a fast-forward) -> the task becomes `merged` with its
merge commit, notice, audit row and `task.merged` event, and the row goes, in one transaction
(exactly once: a second reconcile finds no row); the ref did not move -> the row goes.

A database row rather than a journal file: the intent's resolution then commits atomically with
the task's state change, which a file beside the database cannot."""

import os
import socket
from collections.abc import Callable
from datetime import timedelta

import pygit2
import structlog
from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncSession

from forge.core.access import Principal
from forge.db import audit
from forge.db.audit import Actor
from forge.db.engine import Database, utcnow
from forge.db.events import TaskMerged
from forge.db.models import Account, Repository
from forge.git import RefUpdate
from forge.repos.pulls import Pulls
from forge.repos.repositories import RepoResource
from tasks.core import payloads, repo_settings, task_pulls
from tasks.core.models import MergeIntent, Task
from tasks.core.states import TaskState
from tasks.core.transcript import Notice, Pending
from tasks.services import branches
from tasks.services.reviews import ReviewService
from tasks.services.tasks import TaskService

log = structlog.get_logger("forgehand.tasks")

# Another host's process cannot be asked whether it lives: its intents wait this long.
FOREIGN_STALE = timedelta(minutes=5)

_OWNER = f"{socket.gethostname()}:{os.getpid()}"
_IN_FLIGHT: set[int] = set()  # intents of merges still running in this process


def _owner_gone(owner: str, age: timedelta, intent_id: int) -> bool:
    host, _, pid_text = owner.partition(":")
    if host != socket.gethostname() or not pid_text.isdigit():
        return age > FOREIGN_STALE
    pid = int(pid_text)
    if pid == os.getpid():
        return intent_id not in _IN_FLIGHT
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


async def record(db: Database, task_id: int, base_sha: str, head_sha: str, strategy: str, actor: Actor) -> int:
    """Commit the intent of a merge about to move its base ref; returns its id (in flight)."""
    async with db.session(write=True) as s:
        task = await s.get(Task, task_id)
        assert task is not None
        row = MergeIntent(
            task_id=task_id,
            base=task.base,
            base_sha=base_sha,
            head_sha=head_sha,
            strategy=strategy,
            actor_id=actor.principal.account_id,
            owner=_OWNER,
        )
        s.add(row)
        await s.flush()
        _IN_FLIGHT.add(row.id)
        return row.id


async def drop(db: Database, intent_id: int) -> None:
    """The merge did not move the ref (refused, conflicted): forget its intent."""
    async with db.session(write=True) as s:
        await s.execute(delete(MergeIntent).where(MergeIntent.id == intent_id))


def settled(intent_id: int) -> None:
    """The merge call is over: a row still there is recovery's to reconcile."""
    _IN_FLIGHT.discard(intent_id)


async def record_merged(
    svc: TaskService,
    res: RepoResource,
    task: Task,
    actor: Actor,
    *,
    strategy: str,
    merged_sha: str,
    base_sha: str,
    approvals: list[str],
    delete_branch: bool,
    what: str,
) -> None:
    """Mark the (locked) task merged: branch deletion, notice, state, `task.merged`, audit row."""
    head_sha = task.head_sha
    task.merge_strategy = strategy
    task.merged_sha = merged_sha
    task.merged_by_id = actor.principal.account_id
    task.merged_at = utcnow()
    deleted = False
    if delete_branch:
        deleted = await svc.store.write(res.key, branches.delete_branch, task.branch, head_sha)
    text = f"{actor.principal.login} {what} {task.branch} into {task.base} ({strategy}): {merged_sha[:12]}"
    if deleted:
        text += f"; {task.branch} deleted"
    await svc.life.append(task.id, [Pending(kind="notice", payload=Notice(text=text))])
    pulls = Pulls(svc.session, svc.store, svc.bus, svc.base_url)
    await task_pulls.merged(pulls, actor, res, task, payloads.merged_how(strategy), merged_sha, base_sha)
    if merged_sha != base_sha:  # the base moved: pull requests whose head it is follow it
        moved = RefUpdate(base_sha, merged_sha, f"refs/heads/{task.base}")
        await pulls.after_push(actor, res, [moved])
    await svc.life.set_state(task, res.repo, TaskState.MERGED, actor=actor.principal)
    await svc.life.publish(
        "task.merged",
        task,
        res.repo,
        actor=actor.principal,
        data=TaskMerged(
            strategy=payloads.merged_how(task.merge_strategy),
            base=task.base,
            base_sha_before=base_sha,
            merged_sha=merged_sha,
            head=task.branch,
            head_sha=head_sha,
            approvals=approvals,
            branch_deleted=deleted,
        ),
    )
    audit.record(
        svc.session,
        actor,
        "task.merge",
        f"{res.full_name}#{task.number}",
        strategy=task.merge_strategy,
        merged_sha=merged_sha,
        head_sha=head_sha,
    )


def landed(repo: pygit2.Repository, base: str, base_sha: str, head_sha: str) -> str | None:
    """The commit on `base` that carries the merge of `head_sha` since `base_sha`, or None when
    the ref did not move (or moved for something else). Blocking: `RepoStore.read`."""
    ref = repo.references.get(f"refs/heads/{base}")
    if ref is None or str(ref.target) == base_sha:
        return None
    found = branches.find_merged(repo, base, base_sha, head_sha)
    if found is not None:
        return found
    tip = repo[ref.target].peel(pygit2.Commit).id
    head = pygit2.Oid(hex=head_sha)
    if tip == head or repo.descendant_of(tip, head):
        return head_sha  # a fast-forward (the head itself is on the base)
    return None


async def reconcile(db: Database, make_service: Callable[[AsyncSession], TaskService]) -> int:
    """Finish or drop the intents whose merging process is gone; returns how many were finished."""
    now = utcnow()
    async with db.session() as s:
        rows = (await s.execute(select(MergeIntent).order_by(MergeIntent.id))).scalars().all()
        todo = [r.id for r in rows if _owner_gone(r.owner, now - r.created_at, r.id)]
    finished = 0
    for intent_id in todo:
        try:
            finished += await _reconcile_one(db, make_service, intent_id)
        except Exception:
            log.exception("reconciling a merge intent failed", intent=intent_id)
    return finished


async def _reconcile_one(db: Database, make_service: Callable[[AsyncSession], TaskService], intent_id: int) -> int:
    async with db.session(write=True) as s:
        intent = await s.get(MergeIntent, intent_id)
        if intent is None:
            return 0  # finished by its merge, or by another reconcile
        svc = make_service(s)
        task = await svc.life.lock_id(intent.task_id)
        repo = await s.get(Repository, task.repo_id)
        assert repo is not None
        res = RepoResource(repo=repo)
        merged_sha = await svc.store.read(res.key, landed, intent.base, intent.base_sha, intent.head_sha)
        await s.delete(intent)
        if merged_sha is None or task.state != TaskState.AWAITING_REVIEW or task.head_sha != intent.head_sha:
            log.info("merge intent dropped: the base did not take it", task=task.id, base=intent.base)
            return 0
        account = await s.get(Account, intent.actor_id) if intent.actor_id is not None else None
        actor = Actor(
            principal=Principal(
                account_id=account.id if account else None,
                login=account.login if account else "forgehand",
                type="Bot" if account is not None and account.is_bot else "User",
                via="internal",
            )
        )
        status = await ReviewService(svc).status(task)
        rules = await repo_settings.merge_rules(s, task.repo_id)
        await record_merged(
            svc,
            res,
            task,
            actor,
            strategy=intent.strategy,
            merged_sha=merged_sha,
            base_sha=intent.base_sha,
            approvals=status.approvals,
            delete_branch=rules.delete_branch_on_merge,
            what="merged (recovered after a crash)",
        )
        log.info("merge recovered", task=task.id, merged_sha=merged_sha)
        return 1
