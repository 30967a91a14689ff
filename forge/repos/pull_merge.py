"""Merging a pull request, and Update branch (docs/pulls.md, "Merging").

A merge runs in the request's write transaction with the pull request's row locked (PostgreSQL
`FOR UPDATE`; SQLite's single writer), so two merges of one pull request make one merge commit:
the second finds it merged. Before anything moves, the head the caller read (`sha`) must still be
the head, every branch rule must hold (`merge_rules.unmet`, else `branch_rule_unmet` with the
list) and the merge must be clean. The base then moves by compare-and-swap against the tip the
merge was computed from (`forge.git.merge`): a push that lands meanwhile makes the merge fail
(`base_moved`) and nothing changes; a push to the head after the check is never merged unseen,
because the merge names the exact head commit that was checked. A head already contained in the
base (merged by hand, or a merge whose database commit was lost) marks the pull request merged
without a new commit.

Update branch merges the base into the head branch the same way (compare-and-swap on the head)."""

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import pygit2

from forge.core.access import Action, require
from forge.core.error_codes import Code
from forge.core.errors import BadGateway, Forbidden, InvalidState
from forge.db import audit
from forge.db.audit import Actor
from forge.db.engine import Database
from forge.db.events import AccountRef, EventBus
from forge.db.models import PullRequest
from forge.git import RefUpdate, RepoStore
from forge.git import merge as git_merge
from forge.git.errors import (
    BaseMoved,
    MergeConflicts,
    NotFastForward,
    NothingToMerge,
    RefConflict,
    RefNotFound,
    UnrelatedHistories,
)
from forge.git.merge import MergePlan, MergeStrategy, plan_merge
from forge.git.ref_swap import branch_target
from forge.git.schemas import Identity, MergeConflictFile
from forge.repos import merge_rules
from forge.repos.merge_policy import MergePolicy
from forge.repos.pull_shapes import PullMergeRequest, UpdateBranchRequest
from forge.repos.pull_tasks import TaskWork, refuse_task_pull, task_number_of
from forge.repos.pulls import Pulls
from forge.repos.repositories import RepoResource, load


class MergeRefused(InvalidState):
    """409 with the reason (and, for conflicts, the files)."""


def identity(login: str, base_url: str) -> Identity:
    host = urlsplit(base_url).hostname or "localhost"
    return Identity(name=login, email=f"{login.lower()}@users.{host}")


def _message(pull: PullRequest, data: PullMergeRequest, approvals: list[str]) -> str:
    title = (data.commit_title or "").strip()
    if not title:
        title = (
            f"{pull.title} (#{pull.number})"
            if data.strategy == "squash"
            else f"Merge pull request #{pull.number} from {pull.head_ref}"
        )
    body = (data.commit_message or "").strip() or (pull.title if data.strategy != "squash" else "")
    trailer = "".join(f"\nApproved-by: {a}" for a in approvals)
    return f"{title}\n\n{body}\n{trailer}".rstrip() + "\n" if body or trailer else f"{title}\n"


def conflict_refusal(conflicts: list[MergeConflictFile]) -> MergeRefused:
    files = [{"path": c.path, "kind": c.kind} for c in conflicts]
    paths = ", ".join(f["path"] for f in files[:20])
    return MergeRefused(
        f"the branch conflicts with {len(files)} file(s) of the base: {paths}; merge the base in locally, "
        "resolve them and push",
        code="merge_conflict",
        conflicts=files,
    )


def plan_refusal(plan: MergePlan) -> MergeRefused | None:
    """Why a merge plan cannot be carried out, as the refusal a merge answers (None: it can)."""
    if plan.conflicts:
        return conflict_refusal(plan.conflicts)
    if plan.blocker == "not_fast_forward":
        return MergeRefused(
            f"{plan.base_branch} has moved on: fast-forward is not possible (use merge or squash)",
            code="not_fast_forward",
        )
    if plan.blocker == "nothing_to_merge":
        return MergeRefused("the branch adds nothing to the base", code="nothing_to_merge")
    if plan.blocker == "unrelated_histories":
        return MergeRefused("the branch and the base share no history", code="unrelated_histories")
    return None


@dataclass(frozen=True, slots=True)
class _Planned:
    """What the read phase decided, carried past the `pre_merge` question into the write."""

    head_sha: str
    base_sha: str  # the base tip the merge was computed from: the compare-and-swap's expected value
    up_to_date: bool  # the base holds the head already: recorded merged without a new commit
    message: str
    hook: dict[str, Any]


async def merge_branch(
    store: RepoStore,
    res: RepoResource,
    branch: str,
    sha: str,
    expected: str,
    strategy: MergeStrategy,
    who: Identity,
    message: str,
) -> str:
    """`sha` merged into `branch` by compare-and-swap from `expected`; the branch's new tip. Every
    refusal of the git layer leaves the branch where it was and answers 409 with its code (a pull
    request's merge and Update branch, a task's merge)."""
    try:
        result = await store.write(
            res.key,
            git_merge,
            base_branch=branch,
            head_sha=sha,
            strategy=strategy,
            expected_base_sha=expected,
            author=who,
            committer=who,
            message=message,
        )
    except (BaseMoved, RefConflict):
        raise MergeRefused(
            f"{branch} moved while the merge was prepared (a push or another merge); nothing was changed, try again",
            code="base_moved",
        ) from None
    except MergeConflicts as exc:
        raise conflict_refusal(exc.conflicts) from None
    except NotFastForward:
        raise MergeRefused(f"{branch} has moved on: fast-forward is not possible", code="not_fast_forward") from None
    except NothingToMerge:
        raise MergeRefused("the branch adds nothing to the base", code="nothing_to_merge") from None
    except UnrelatedHistories:
        raise MergeRefused("the branch and the base share no history", code="unrelated_histories") from None
    return result.new_base_sha


class PullMerge:
    def __init__(self, pulls: Pulls) -> None:
        self.pulls = pulls

    async def plan(self, actor: Actor, res: RepoResource, number: int, data: PullMergeRequest) -> _Planned:
        """The read phase: open, at the head the caller read, every rule met, a clean plan."""
        require(actor.principal, Action.PULL_REVIEW, res)
        pull = await self.pulls.get(res, number)
        refuse_task_pull(res, pull, self.pulls.base_url)
        await self._check_merger(actor, res, pull)
        await self._check(res, pull, data.sha)
        unmet, found = await merge_rules.unmet(self.pulls.session, res, pull, self.pulls.store)
        if unmet:
            raise MergeRefused(
                "the branch rules do not hold yet: " + "; ".join(unmet), code=Code.BRANCH_RULE_UNMET, unmet_rules=unmet
            )
        try:
            plan = await self.pulls.store.read(res.key, plan_merge, pull.base_ref, pull.head_sha, data.strategy)
        except RefNotFound:
            raise MergeRefused(f"the base branch {pull.base_ref!r} is gone", code="base_not_found") from None
        refusal = None if plan.up_to_date else plan_refusal(plan)
        if refusal is not None:
            raise refusal
        hook = {
            "base": pull.base_ref,
            "head": pull.head_ref,
            "head_sha": pull.head_sha,
            "strategy": data.strategy,
            "approvals": found.approvals,
            "pull_request": {"number": pull.number, "title": pull.title, "html_url": self.pulls.html_url(res, number)},
        }
        return _Planned(
            head_sha=pull.head_sha,
            base_sha=plan.base_sha,
            up_to_date=plan.up_to_date,
            message=_message(pull, data, found.approvals),
            hook=hook,
        )

    async def write(
        self, actor: Actor, res: RepoResource, number: int, data: PullMergeRequest, planned: _Planned
    ) -> PullRequest:
        """The write phase, the pull request locked: everything checked again, then the base moved
        by compare-and-swap from the planned tip and the pull request recorded merged."""
        require(actor.principal, Action.PULL_REVIEW, res)
        pull = await self.pulls.get(res, number, lock=True)
        if pull.base_ref != planned.hook["base"]:  # retargeted while pre_merge was asked
            raise MergeRefused(
                f"#{pull.number} now goes into {pull.base_ref}, not {planned.hook['base']}: nothing was changed, "
                "try again",
                code="base_moved",
            )
        await self._check_merger(actor, res, pull)
        await self._check(res, pull, planned.head_sha)
        unmet, _ = await merge_rules.unmet(self.pulls.session, res, pull, self.pulls.store)
        if unmet:
            raise MergeRefused(
                "the branch rules do not hold yet: " + "; ".join(unmet), code=Code.BRANCH_RULE_UNMET, unmet_rules=unmet
            )
        if planned.up_to_date:
            return await self._record(actor, res, pull, "already_merged", planned.base_sha, planned.base_sha)
        new_base = await self._move(
            res, pull.base_ref, pull.head_sha, planned.base_sha, data.strategy, actor, planned.message
        )
        merged = await self._record(actor, res, pull, data.strategy, new_base, planned.base_sha)
        # Pull requests whose head is this base (stacked on it) follow it.
        await self.pulls.after_push(actor, res, [RefUpdate(planned.base_sha, new_base, f"refs/heads/{pull.base_ref}")])
        return merged

    async def _check_merger(self, actor: Actor, res: RepoResource, pull: PullRequest) -> None:
        rules = await merge_rules.base_rules(self.pulls.session, res, pull.base_ref)
        if not merge_rules.may_merge(rules, actor.principal.login or ""):
            names = ", ".join("@" + login for login in rules.merge_allowlist)
            raise Forbidden(
                f"only {names} may merge into {pull.base_ref} (its branch rules): ask one of them",
                code=Code.NOT_ALLOWED_TO_MERGE,
            )

    async def _check(self, res: RepoResource, pull: PullRequest, expected: str | None) -> None:
        if pull.state != "open":
            raise MergeRefused(f"#{pull.number} is {pull.state}", code=Code.PULL_NOT_OPEN)
        if not pull.head_sha:
            raise MergeRefused(f"the head branch {pull.head_ref} was deleted", code=Code.PULL_HEAD_GONE)
        live = await self.pulls.store.read(res.key, _tip, pull.head_ref)
        if live != pull.head_sha:  # a push the database has not recorded yet: wait for it
            raise MergeRefused(
                f"{pull.head_ref} is moving (a push is being recorded): reload and try again",
                code=Code.HEAD_MOVED,
                head_sha=live or "",
            )
        given = (expected or "").strip().lower()
        if given and given != pull.head_sha:
            raise MergeRefused(
                f"the head is {pull.head_sha[:12]}, not {given[:12]}: review the new commits first",
                code=Code.HEAD_MOVED,
                head_sha=pull.head_sha,
            )

    async def _move(
        self,
        res: RepoResource,
        branch: str,
        sha: str,
        expected: str,
        strategy: MergeStrategy,
        actor: Actor,
        message: str,
    ) -> str:
        """`sha` merged into `branch` from its expected tip; the branch's new tip."""
        who = identity(actor.principal.login or "forgehand", self.pulls.base_url)
        return await merge_branch(self.pulls.store, res, branch, sha, expected, strategy, who, message)

    async def _record(
        self, actor: Actor, res: RepoResource, pull: PullRequest, how: str, merged_sha: str, base_before: str
    ) -> PullRequest:
        return await self.pulls.record_merged(actor, res, pull, how, merged_sha, base_before)

    async def update_branch(
        self, actor: Actor, res: RepoResource, number: int, data: UpdateBranchRequest
    ) -> PullRequest:
        """Merge the base into the head branch (the head moves; reviews of the old head go stale)."""
        require(actor.principal, Action.PULL_WRITE, res)
        pull = await self.pulls.get(res, number, lock=True)
        refuse_task_pull(res, pull, self.pulls.base_url)
        await merge_rules.head_writable(self.pulls.session, res, pull.head_ref)
        await self._check(res, pull, data.expected_head_sha)
        base_tip = await self.pulls.store.read(res.key, _tip, pull.base_ref)
        if base_tip is None:
            raise MergeRefused(f"the base branch {pull.base_ref!r} is gone", code="base_not_found")
        plan = await self.pulls.store.read(res.key, plan_merge, pull.head_ref, base_tip, "merge")
        if plan.up_to_date:
            raise MergeRefused(f"{pull.head_ref} already has every commit of {pull.base_ref}", code="nothing_to_merge")
        refusal = plan_refusal(plan)
        if refusal is not None:
            raise refusal
        message = f"Merge branch '{pull.base_ref}' into {pull.head_ref}\n"
        before = pull.head_sha
        new_head = await self._move(res, pull.head_ref, base_tip, before, "merge", actor, message)
        audit.record(
            self.pulls.session,
            actor,
            "repo.pull.update_branch",
            f"{res.full_name}#{pull.number}",
            before=before,
            after=new_head,
        )
        await self.pulls.after_push(actor, res, [RefUpdate(before, new_head, f"refs/heads/{pull.head_ref}")])
        return pull


def _tip(repo: pygit2.Repository, branch: str) -> str | None:
    return branch_target(repo, f"refs/heads/{branch}")


@dataclass(frozen=True, slots=True)
class MergeRunner:
    """A merge in three steps, so that no database lock is held while a policy consumer thinks:
    the read phase (`PullMerge.plan`) in a transaction of its own, the `pre_merge` question with
    no transaction open, then the write phase (`PullMerge.write`) in a write transaction that
    checks everything again under the pull request's lock. A base ref that moved but whose
    database commit was lost is found on the next attempt: the base holds the head, and the pull
    request is recorded merged without a new commit (`already_merged`)."""

    db: Database
    store: RepoStore
    bus: EventBus
    base_url: str
    policy: MergePolicy
    tasks: TaskWork | None = None  # merges a task's pull request through its task

    async def merge(self, actor: Actor, owner: str, name: str, number: int, data: PullMergeRequest) -> PullRequest:
        async with self.db.session() as s:
            res = await load(s, actor.principal, owner, name)
            pulls = Pulls(s, self.store, self.bus, self.base_url)
            task = task_number_of((await pulls.get(res, number)).head_ref) if self.tasks is not None else None
            if task is None:
                planned = await PullMerge(pulls).plan(actor, res, number, data)
                repo = (res.repo.id, res.repo.uuid, res.full_name)
        if task is not None and self.tasks is not None:
            return await self._merge_task(actor, owner, name, number, task, data)
        if not planned.up_to_date:
            verdict = await self.policy.pre_merge(
                repo_id=repo[0], repo_uuid=repo[1], full_name=repo[2], actor=AccountRef.of(actor.principal),
                merge=planned.hook,
            )  # fmt: skip
            if verdict.failed:
                raise BadGateway(verdict.reason, code="hook_dispatch_failed")
            if not verdict.allowed:
                raise Forbidden(verdict.reason or "a policy refused the merge", code="policy_denied")
        async with self.db.session(write=True) as s:
            res = await load(s, actor.principal, owner, name)
            return await PullMerge(Pulls(s, self.store, self.bus, self.base_url)).write(
                actor, res, number, data, planned
            )

    async def _merge_task(
        self, actor: Actor, owner: str, name: str, number: int, task: int, data: PullMergeRequest
    ) -> PullRequest:
        """A task's pull request merges as its task does; the task's merge records it merged."""
        assert self.tasks is not None
        await self.tasks.merge(actor, owner, name, task, data.strategy, (data.sha or "").strip().lower())
        async with self.db.session() as s:
            res = await load(s, actor.principal, owner, name)
            return await Pulls(s, self.store, self.bus, self.base_url).get(res, number)
