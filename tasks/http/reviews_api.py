"""REST for reviews and merge: submit and list reviews, the diff under review, the merge rules'
verdict, and the merge itself (see tasks/services/reviews.py and tasks/services/merge.py)."""

from litestar import Controller, delete, get, post
from litestar.params import FromPath, JSONBody

from forge.git.schemas import Comparison
from tasks.core.schemas import (
    MergeCreate,
    ReviewCommentCreate,
    ReviewCreate,
    ReviewDraftRead,
    ReviewRead,
    ReviewStatus,
    TaskRead,
)
from tasks.http.actions import add_draft_comment, merge_task, remove_draft_comment, submit_review
from tasks.http.deps import DEPENDENCIES, TASK, TaskScopeDep
from tasks.services import rules
from tasks.services.review_drafts import DraftService
from tasks.services.reviews import ReviewService


class ReviewController(Controller):
    tags = ["reviews"]
    dependencies = DEPENDENCIES

    @get(TASK + "/compare", summary="The diff under review: base...head at the task's head commit")
    async def compare(self, task_scope: TaskScopeDep) -> Comparison:
        rules.require_read_contents(task_scope.actor.principal, task_scope.res)  # a diff shows files
        return await ReviewService(task_scope.svc).comparison(task_scope.res, task_scope.task)

    @get(TASK + "/reviews", summary="The task's reviews, oldest first (outdated ones included)")
    async def list_reviews(self, task_scope: TaskScopeDep) -> list[ReviewRead]:
        quoted = rules.may_read_contents(task_scope.actor.principal, task_scope.res)
        return await ReviewService(task_scope.svc).reviews(task_scope.task, quoted=quoted)

    @post(
        TASK + "/reviews",
        summary="Review the task's head: approve, request changes (starts a follow-up run) or comment",
        status_code=201,
    )
    async def submit(self, task_scope: TaskScopeDep, data: JSONBody[ReviewCreate]) -> ReviewRead:
        return await submit_review(task_scope, data)

    @get(TASK + "/review-draft", summary="Your pending review: inline comments your next review publishes")
    async def draft(self, task_scope: TaskScopeDep) -> ReviewDraftRead:
        drafts = DraftService(ReviewService(task_scope.svc))
        return await drafts.read(task_scope.actor, task_scope.res, task_scope.task)

    @post(
        TASK + "/review-draft/comments",
        summary="Add an inline comment to your pending review (published with your next review's verdict)",
        status_code=201,
    )
    async def add_draft_comment(self, task_scope: TaskScopeDep, data: JSONBody[ReviewCommentCreate]) -> ReviewDraftRead:
        return await add_draft_comment(task_scope, data)

    @delete(
        TASK + "/review-draft/comments/{comment_id:int}",
        summary="Remove a comment from your pending review",
        status_code=200,
    )
    async def remove_draft_comment(self, task_scope: TaskScopeDep, comment_id: FromPath[int]) -> ReviewDraftRead:
        return await remove_draft_comment(task_scope, comment_id)

    @get(TASK + "/review-status", summary="Whether the merge rules hold now, and why not")
    async def status(self, task_scope: TaskScopeDep) -> ReviewStatus:
        return await ReviewService(task_scope.svc).status(task_scope.task)

    @post(
        TASK + "/merge",
        summary="Merge the task into its base (409 with a reason when the rules or a conflict refuse it)",
        status_code=200,
    )
    async def merge(self, task_scope: TaskScopeDep, data: JSONBody[MergeCreate]) -> TaskRead:
        return await merge_task(task_scope, data)
