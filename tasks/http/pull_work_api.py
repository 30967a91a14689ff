"""The tasks side of a task's pull request (forge's `TaskWork`): a merge or a review of the pull
request over the API is the task's merge or review, with the task's rules, its `pre_merge`
question and, on a change request, the agent's follow-up run on the same branch."""

from typing import TypeVar

import msgspec
from sqlalchemy import select

from forge.core.access import Action
from forge.core.errors import InvalidInput
from forge.db.audit import Actor
from forge.db.events import AccountRef
from forge.git.merge import MergeStrategy
from forge.repos import repositories
from forge.repos.pull_shapes import PullReviewCreate, PullReviewRead, ReviewState
from forge.repos.pull_tasks import TaskPullStatus
from tasks.core.models import Review
from tasks.core.schemas import MergeCreate, ReviewCreate
from tasks.http.actions import submit_review
from tasks.http.deps import TaskScope
from tasks.services.reviews import ReviewService
from tasks.system import TaskSystem

_T = TypeVar("_T")
_VERDICTS = {"APPROVE": "approve", "REQUEST_CHANGES": "request_changes", "COMMENT": "comment"}
_STATES: dict[str, ReviewState] = {
    "approve": "APPROVED",
    "request_changes": "CHANGES_REQUESTED",
    "comment": "COMMENTED",
}


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
        await self.system.merge_service().merge(actor, owner, name, task, data)

    async def review(self, actor: Actor, owner: str, name: str, task: int, data: PullReviewCreate) -> int:
        if data.event is None:
            raise InvalidInput(
                "a pending review of a task's work is kept on the task's review page (review-draft): "
                "send the review with its event",
                field="event",
            )
        # Converted, not constructed: the schema's checks and its enum values apply as over REST.
        review = _convert(
            {
                "verdict": _VERDICTS[data.event],
                "body": data.body,
                "commit_sha": (data.commit_id or "").strip().lower(),
                "comments": [
                    {"path": c.path, "line": c.line, "body": c.body, "side": "base" if c.side == "LEFT" else "head"}
                    for c in data.comments
                ],
            },
            ReviewCreate,
        )
        async with self.system.db.session() as s:
            res = await repositories.load(s, actor.principal, owner, name, Action.TASK_READ)
            svc = self.system.service(s)
            found = await svc.get(res, task)
            scope = TaskScope(
                system=self.system, actor=actor, owner=owner, name=name, session=s, res=res, svc=svc,
                number=task, task=found,
            )  # fmt: skip
            read = await submit_review(scope, review)
        async with self.system.db.session() as s:
            return int((await s.execute(select(Review.id).where(Review.uuid == read.id))).scalar_one())

    async def reviews(self, actor: Actor, owner: str, name: str, task: int) -> list[PullReviewRead]:
        async with self.system.db.session() as s:
            res = await repositories.load(s, actor.principal, owner, name, Action.TASK_READ)
            found = await self.system.service(s).get(res, task)
            reads = await ReviewService(self.system.service(s)).reviews(found, quoted=False)
            rows = (await s.execute(select(Review.uuid, Review.id).where(Review.task_id == found.id))).all()
            ids: dict[str, int] = {uuid: review_id for uuid, review_id in rows}  # noqa: C416  (typed)
            page = f"{self.system.settings.effective_base_url}/{res.full_name}/tasks/{task}/review"
        return [
            PullReviewRead(
                id=ids[r.id],
                user=AccountRef(login=r.author) if r.author else None,
                body=r.body,
                state=_STATES[r.verdict],
                commit_id=r.commit_sha,
                submitted_at=r.created_at,
                html_url=f"{page}#review-{ids[r.id]}",
            )
            for r in reads
            if r.verdict in _STATES  # published reviews only: a draft is its author's, on the task's page
        ]

    async def status(self, actor: Actor, owner: str, name: str, task: int) -> TaskPullStatus:
        async with self.system.db.session() as s:
            res = await repositories.load(s, actor.principal, owner, name, Action.TASK_READ)
            svc = self.system.service(s)
            found = await ReviewService(svc).status(await svc.get(res, task))
        return TaskPullStatus(
            approvals=found.approvals, required_approvals=found.required_approvals, blockers=found.blockers
        )
