"""Merging a reviewed task into its base branch.

Order (nothing moves until everything agreed):
1. read: the task is awaiting review, its head is the one the caller expects, the merge rules hold
   (`ReviewService.status`), and pygit2 merges `base` and `head` in memory without conflicts
   (conflicts are reported file by file and the task stays in review);
2. the `pre_merge` policy hook (outside any transaction: a slow consumer never holds a database
   lock), which can deny with a reason;
3. write: the task row is locked and checked again, then the base ref is moved with a
   compare-and-swap against the base commit the merge was computed from, so a concurrent push
   (or merge) is never overwritten: the loser gets 409 `base_moved` and nothing changed;
4. the task becomes `merged`, `task.merged` is published, the branch is kept or deleted (a
   repository setting), all in the same transaction as the audit row.
A head that is already contained in the base (pushed by hand, or a merge whose database commit
was lost) marks the task merged without a new commit."""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete
from sqlalchemy.ext.asyncio import AsyncSession

from forge.core.access import Action
from forge.core.error_codes import Code
from forge.core.errors import BadGateway, Forbidden, InvalidState
from forge.db.audit import Actor
from forge.db.engine import Database
from forge.db.models import Account
from forge.git.errors import (
    RefNotFound,
)
from forge.git.merge import MergePlan, plan_merge
from forge.repos import merge_rules as branch_rules
from forge.repos.pull_merge import MergeRefused, identity, merge_branch, plan_refusal
from forge.repos.repositories import RepoResource, load
from tasks.core import repo_settings
from tasks.core.lifecycle import gate_context
from tasks.core.models import MergeIntent, Task
from tasks.core.policy import GateContext, PolicyGate
from tasks.core.schemas import MergeCreate
from tasks.core.states import TaskState
from tasks.services import branches, rules
from tasks.services import merge_intents as intents
from tasks.services.merge_intents import record_merged
from tasks.services.reviews import ReviewService
from tasks.services.tasks import TaskService


def _message(task: Task, strategy: str, url: str, approvals: list[str]) -> str:
    # `Task-Head:` lets a merge whose database commit was lost be recognised (branches.find_merged).
    trailer = f"Task {url}\nTask-Head: {task.head_sha}" + "".join(f"\nApproved-by: {a}" for a in approvals)
    summary = f"\n\n{task.summary.strip()}" if task.summary.strip() else ""
    if strategy == "squash":
        return f"{task.title} (task #{task.number}){summary}\n\n{trailer}\n"
    return f"Merge task #{task.number}: {task.title}\n\nBranch {task.branch} into {task.base}.{summary}\n\n{trailer}\n"


async def _check_merger(session: AsyncSession, res: RepoResource, task: Task, actor: Actor) -> None:
    """The base branch's merge allow-list binds a task's merge as any pull request's."""
    base = await branch_rules.base_rules(session, res, task.base)
    if not branch_rules.may_merge(base, actor.principal.login or ""):
        names = ", ".join("@" + login for login in base.merge_allowlist)
        raise Forbidden(
            f"only {names} may merge into {task.base} (its branch rules): ask one of them",
            code=Code.NOT_ALLOWED_TO_MERGE,
        )


@dataclass(slots=True)
class _Prepared:
    """What the read phase decided, carried past the `pre_merge` hook into the write."""

    task_id: int
    head_sha: str
    base_sha: str  # the base the merge was computed from (the compare-and-swap's expected value)
    already: bool  # contained in the base already: marked merged without a new commit
    merged_sha: str
    message: str
    ctx: GateContext
    hook: dict[str, Any]
    gate: PolicyGate
    moved: bool = False  # the base ref moved: from here on, recovery finishes what the write does not


class MergeService:
    def __init__(self, db: Database, make_service: Callable[[AsyncSession], TaskService]) -> None:
        # `make_service(session)`: the task service on that session (bus, store, settings, gate).
        self.db = db
        self.make_service = make_service

    async def merge(self, actor: Actor, owner: str, name: str, number: int, data: MergeCreate) -> int:
        """Merge the task; returns its id. Raises a ForgeError (409 with a reason) when refused."""
        prepared = await self._prepare(actor, owner, name, number, data)
        if not prepared.already:
            await self._ask_pre_merge(prepared)
        # The intent is committed before the ref can move (a crash in between is finished or
        # dropped by `merge_intents.reconcile`), and deleted with the task's `merged` state.
        intent = None
        if not prepared.already:
            intent = await intents.record(
                self.db, prepared.task_id, prepared.base_sha, prepared.head_sha, data.strategy, actor
            )
        try:
            await self._write(actor, owner, name, number, data, prepared)
        except BaseException:
            if intent is not None and not prepared.moved:
                await intents.drop(self.db, intent)
            raise
        finally:
            if intent is not None:
                intents.settled(intent)
        return prepared.task_id

    async def _prepare(self, actor: Actor, owner: str, name: str, number: int, data: MergeCreate) -> _Prepared:
        """The read phase: the task in review at the expected head, the merge rules, the plan (or the
        head found merged already), the hook's context and payload."""
        async with self.db.session() as s:
            svc: TaskService = self.make_service(s)
            res = await load(s, actor.principal, owner, name, Action.TASK_READ)
            task = await svc.get(res, number)
            rules.require_merge(actor.principal, res, task)
            await _check_merger(s, res, task, actor)
            reviews = ReviewService(svc)
            self._check_head(task, data)
            status = await reviews.status(task)
            if status.blockers:
                raise MergeRefused("; ".join(status.blockers), code="merge_blocked", blockers=status.blockers)
            try:
                plan = await svc.store.read(res.key, plan_merge, task.base, task.head_sha, data.strategy)
            except RefNotFound:
                raise MergeRefused(f"the base branch {task.base!r} is gone", code="base_not_found") from None
            already, merged_sha = await self._already_merged(svc, res, task, plan)
            if not already:
                self._check_plan(plan)
            agent = await s.get(Account, task.agent_id)
            ctx = gate_context(
                task, res.full_name, res.repo.uuid, svc.base_url, actor.principal, agent.login if agent else ""
            )
            comparison = await reviews.comparison(res, task)
            hook = {
                "base": task.base,
                "head": task.branch,
                "head_sha": task.head_sha,
                "strategy": data.strategy,
                "approvals": status.approvals,
                "diffstat": {
                    "files": comparison.stats.files,
                    "additions": comparison.stats.additions,
                    "deletions": comparison.stats.deletions,
                },
            }
            url = f"{svc.base_url}/{res.full_name}/tasks/{task.number}"
            return _Prepared(
                task_id=task.id,
                head_sha=task.head_sha,
                base_sha=plan.base_sha,
                already=already,
                merged_sha=merged_sha,
                message=_message(task, data.strategy, url, status.approvals),
                ctx=ctx,
                hook=hook,
                gate=svc.gate,
            )

    @staticmethod
    async def _already_merged(svc: TaskService, res: RepoResource, task: Task, plan: MergePlan) -> tuple[bool, str]:
        """(whether the head is in the base already, the base commit that holds it)."""
        # Contained in the base already (and not simply unchanged): it was merged another way;
        # or a squash of this head is on the base (a merge whose database commit was lost).
        if plan.up_to_date and task.head_sha != task.base_sha:
            return True, plan.base_sha
        squashed = await svc.store.read(res.key, branches.find_merged, task.base, task.base_sha, task.head_sha)
        if squashed is not None:
            return True, squashed
        return False, plan.base_sha

    @staticmethod
    async def _ask_pre_merge(prepared: _Prepared) -> None:
        """The `pre_merge` policy hook, outside any transaction."""
        decision = await prepared.gate.pre_merge(prepared.ctx, merge=prepared.hook)
        if decision.failed:
            raise BadGateway(decision.reason, code="hook_dispatch_failed")
        if decision.decision != "allow":
            raise Forbidden(
                decision.user_message or decision.reason or "a policy refused the merge", code="policy_denied"
            )

    async def _write(
        self, actor: Actor, owner: str, name: str, number: int, data: MergeCreate, prepared: _Prepared
    ) -> None:
        """The write phase: the task locked and checked again, the base ref moved (compare-and-swap),
        the task marked merged and its intent deleted, in one transaction."""
        async with self.db.session(write=True) as s:
            svc = self.make_service(s)
            res = await load(s, actor.principal, owner, name, Action.TASK_READ)
            task = await svc.life.lock(await svc.get(res, number))
            await _check_merger(s, res, task, actor)
            # Everything may have changed while the hook was asked: check again under the lock.
            self._check_head(task, data, prepared.head_sha)
            status = await ReviewService(svc).status(task)
            if status.blockers:
                raise MergeRefused("; ".join(status.blockers), code="merge_blocked", blockers=status.blockers)
            merge_rules = await repo_settings.merge_rules(s, task.repo_id)
            merged_sha = prepared.merged_sha
            if not prepared.already:
                merged_sha = await self._move_base(svc, res, task, actor, data, prepared)
                prepared.moved = True
            await record_merged(
                svc,
                res,
                task,
                actor,
                strategy=data.strategy if not prepared.already else "already_merged",
                merged_sha=merged_sha,
                base_sha=prepared.base_sha,
                approvals=status.approvals,
                delete_branch=merge_rules.delete_branch_on_merge,
                what="merged" if not prepared.already else "found already merged",
            )
            await s.execute(delete(MergeIntent).where(MergeIntent.task_id == task.id))

    @staticmethod
    async def _move_base(
        svc: TaskService, res: RepoResource, task: Task, actor: Actor, data: MergeCreate, prepared: _Prepared
    ) -> str:
        """The merge commit written and the base ref moved from the planned base; its new commit.
        Every refusal of the git layer leaves the base where it was."""
        who = identity(actor.principal.login, svc.base_url)
        return await merge_branch(
            svc.store, res, task.base, prepared.head_sha, prepared.base_sha, data.strategy, who, prepared.message
        )

    @staticmethod
    def _check_head(task: Task, data: MergeCreate, planned: str | None = None) -> None:
        if task.state != TaskState.AWAITING_REVIEW:
            raise InvalidState(f"the task is {task.state}, not awaiting review", code="task_not_in_review")
        expected = data.expected_head_sha.strip().lower()
        if expected and expected != task.head_sha:
            raise MergeRefused(
                f"the task's head is {task.head_sha[:12]}, not {expected[:12]}: review the new changes first",
                code="stale_head",
                head_sha=task.head_sha,
            )
        if task.head_sha == task.base_sha:  # every run changed nothing: an empty diff is never merged
            raise MergeRefused("the task's runs changed nothing: there is nothing to merge", code="task_no_changes")
        if planned is not None and planned != task.head_sha:
            raise MergeRefused("the task's head moved while the merge was prepared", code="stale_head")

    @staticmethod
    def _check_plan(plan: MergePlan) -> None:
        refusal = plan_refusal(plan)
        if refusal is not None:
            raise refusal
