"""The tasks side of a task's pull request (forge's `TaskWork`): a merge or a review of the pull
request (its page or its API) is the task's merge or review, with the task's rules, its
`pre_merge` question and, on a change request, the agent's follow-up run on the same branch; its
line comments and pending reviews are the task's inline comments and review drafts."""

from typing import TypeVar

import msgspec
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from forge.core.access import Action
from forge.core.error_codes import Code
from forge.core.errors import InvalidInput
from forge.db.audit import Actor
from forge.git.merge import MergeStrategy
from forge.repos import repositories
from forge.repos.pull_merge import MergeRefused
from forge.repos.pull_shapes import PullReviewCreate, PullReviewRead
from forge.repos.pull_tasks import TaskPullSide, TaskPullStatus
from forge.repos.repositories import RepoResource
from tasks.core.models import Review, Task
from tasks.core.schemas import MergeCreate, ReviewCommentCreate, ReviewCreate
from tasks.core.states import TaskState
from tasks.http.actions import submit_review
from tasks.http.deps import TaskScope
from tasks.http.pull_work_reads import TaskReviewReads, task_review_reads
from tasks.services import rules
from tasks.services.review_drafts import DraftService
from tasks.services.reviews import ReviewService
from tasks.services.tasks import TaskService
from tasks.system import TaskSystem

_T = TypeVar("_T")
_VERDICTS = {"APPROVE": "approve", "REQUEST_CHANGES": "request_changes", "COMMENT": "comment"}


def _convert(raw: dict[str, object], shape: type[_T]) -> _T:
    """The task API's body from the pull request's: its own limits apply (a longer body is 422)."""
    try:
        return msgspec.convert(raw, shape)
    except msgspec.ValidationError as exc:
        raise InvalidInput(f"{exc} (the task's review takes it so)") from None


class TaskWorkForPulls:
    def __init__(self, system: TaskSystem) -> None:
        self.system = system

    async def merge(
        self, actor: Actor, owner: str, name: str, task: int, strategy: MergeStrategy, head_sha: str
    ) -> None:
        data = _convert({"strategy": strategy, "expected_head_sha": head_sha}, MergeCreate)
        try:
            await self.system.merge_service().merge(actor, owner, name, task, data)
        except MergeRefused as exc:
            if exc.code != Code.MERGE_BLOCKED:
                raise
            # Answered as a person's pull request is: the rules that do not hold, as `unmet_rules`
            # (the task's own merge endpoint keeps `merge_blocked` with `blockers`).
            blockers = list(exc.extra.get("blockers") or [])
            raise MergeRefused(exc.detail, code=Code.BRANCH_RULE_UNMET, unmet_rules=blockers) from None

    async def review(self, actor: Actor, owner: str, name: str, task: int, data: PullReviewCreate) -> int:
        comments: list[dict[str, object]] = [
            {"path": c.path, "line": c.line, "body": c.body, "side": "base" if c.side == "LEFT" else "head"}
            for c in data.comments
        ]
        if data.event is None:
            return await self._pending(actor, owner, name, task, data, comments)
        # Converted, not constructed: the schema's checks and its enum values apply as over REST.
        review = _convert(
            {
                "verdict": _VERDICTS[data.event],
                "body": data.body,
                "commit_sha": (data.commit_id or "").strip().lower(),
                "comments": comments,
            },
            ReviewCreate,
        )
        async with self.system.db.session() as s:
            read = await submit_review(await self._scope(s, actor, owner, name, task), review)
        async with self.system.db.session() as s:
            return int((await s.execute(select(Review.id).where(Review.uuid == read.id))).scalar_one())

    async def _pending(
        self, actor: Actor, owner: str, name: str, task: int, data: PullReviewCreate, comments: list[dict[str, object]]
    ) -> int:
        """A review without its event: its line comments gathered in the reader's draft."""
        if data.body.strip():
            raise InvalidInput(
                "a pending review of a task's work gathers line comments: its body comes with the verdict",
                field="body",
            )
        if not comments:
            raise InvalidInput("a pending review gathers line comments: add one", field="comments")
        wanted = [_convert(c, ReviewCommentCreate) for c in comments]
        async with self.system.db.session(write=True) as s:
            res = await repositories.load(s, actor.principal, owner, name, Action.TASK_READ)
            svc = self.system.service(s)
            found = await svc.life.lock(await svc.get(res, task))
            drafts = DraftService(ReviewService(svc))
            added = [await drafts.add(actor, res, found, c) for c in wanted]
            return added[-1].review_id

    async def discard(self, actor: Actor, owner: str, name: str, task: int, review_id: int) -> None:
        async with self.system.db.session(write=True) as s:
            res = await repositories.load(s, actor.principal, owner, name, Action.TASK_READ)
            svc = self.system.service(s)
            await DraftService(ReviewService(svc)).discard(actor, res, await svc.get(res, task), review_id)

    async def reviews(self, actor: Actor, owner: str, name: str, task: int) -> list[PullReviewRead]:
        async with self.system.db.session() as s:
            res = await repositories.load(s, actor.principal, owner, name, Action.TASK_READ)
            found = await self.system.service(s).get(res, task)
            return (await self._reads(s, actor, res, found)).reviews

    async def side(self, actor: Actor, owner: str, name: str, task: int) -> TaskPullSide:
        async with self.system.db.session() as s:
            res = await repositories.load(s, actor.principal, owner, name, Action.TASK_READ)
            svc = self.system.service(s)
            found = await svc.get(res, task)
            reads = await self._reads(s, actor, res, found)
            status = await self._status(svc, found)
        return TaskPullSide(reviews=reads.reviews, comments=reads.comments, runs=reads.runs, status=status)

    async def status(self, actor: Actor, owner: str, name: str, task: int) -> TaskPullStatus:
        async with self.system.db.session() as s:
            res = await repositories.load(s, actor.principal, owner, name, Action.TASK_READ)
            svc = self.system.service(s)
            return await self._status(svc, await svc.get(res, task))

    # -- helpers ---------------------------------------------------------------------------

    async def _scope(self, s: AsyncSession, actor: Actor, owner: str, name: str, task: int) -> TaskScope:
        res = await repositories.load(s, actor.principal, owner, name, Action.TASK_READ)
        svc = self.system.service(s)
        found = await svc.get(res, task)
        return TaskScope(
            system=self.system, actor=actor, owner=owner, name=name, session=s, res=res, svc=svc,
            number=task, task=found,
        )  # fmt: skip

    async def _reads(self, s: AsyncSession, actor: Actor, res: RepoResource, task: Task) -> TaskReviewReads:
        base = self.system.settings.effective_base_url
        number = task.result_pull_number
        url = (
            f"{base}/{res.full_name}/pull/{number}" if number else f"{base}/{res.full_name}/tasks/{task.number}/review"
        )
        quoted = rules.may_read_contents(actor.principal, res)
        return await task_review_reads(s, task, actor.principal.account_id, url, quoted=quoted)

    @staticmethod
    async def _status(svc: TaskService, task: Task) -> TaskPullStatus:
        found = await ReviewService(svc).status(task)
        return TaskPullStatus(
            approvals=found.approvals,
            required_approvals=found.required_approvals,
            blockers=found.blockers,
            merge_strategy=task.merge_strategy if task.state == TaskState.MERGED else None,
        )
