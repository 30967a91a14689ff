"""Review drafts: a reviewer's inline comments gathered one at a time on a pending review (seen
only by its author), then published together with the verdict of their next review
(`ReviewService.submit` turns the draft into that review). Checked like a review's own comments:
the reviewer may review, the task awaits review, each line is in the diff under review."""

from forge.core.errors import InvalidState, NotFound
from forge.db import audit
from forge.db.audit import Actor
from forge.repos.repositories import RepoResource
from tasks.core.models import Review, ReviewComment, Task
from tasks.core.schemas import ReviewCommentCreate, ReviewDraftRead
from tasks.core.states import TaskState
from tasks.services import rules
from tasks.services.reviews import DRAFT, ReviewService, comment_read

MAX_DRAFT_COMMENTS = 200  # what one review may carry (`ReviewCreate.comments`)


class DraftService:
    def __init__(self, reviews: ReviewService) -> None:
        self.reviews = reviews
        self.session = reviews.session

    async def read(self, actor: Actor, res: RepoResource, task: Task) -> ReviewDraftRead:
        rules.require_review(actor.principal, res, task)
        draft = await self.reviews.draft(actor.principal, task)
        comments = await self.reviews.draft_comments(draft) if draft is not None else []
        return ReviewDraftRead(comments=[comment_read(c, task) for c in comments])

    async def add(self, actor: Actor, res: RepoResource, task: Task, data: ReviewCommentCreate) -> ReviewComment:
        rules.require_review(actor.principal, res, task)
        if task.state != TaskState.AWAITING_REVIEW:
            raise InvalidState(f"the task is {task.state}, not awaiting review", code="task_not_in_review")
        [comment] = await self.reviews.inline_comments(res, task, [data])
        draft = await self.reviews.draft(actor.principal, task)
        if draft is None:
            draft = Review(
                task_id=task.id,
                repo_id=task.repo_id,
                author_id=actor.principal.account_id,
                verdict=DRAFT,
                body="",
                commit_sha=task.head_sha,
            )
            self.session.add(draft)
            await self.session.flush()
        elif len(await self.reviews.draft_comments(draft)) >= MAX_DRAFT_COMMENTS:
            raise InvalidState(
                f"a review carries at most {MAX_DRAFT_COMMENTS} comments: submit this one first",
                code="review_draft_full",
            )
        comment.review_id, comment.commit_sha = draft.id, task.head_sha
        self.session.add(comment)
        await self.session.flush()
        audit.record(
            self.session,
            actor,
            "task.review_draft.comment",
            f"{res.full_name}#{task.number}",
            path=comment.path,
            line=comment.line,
            side=comment.side,
        )
        return comment

    async def remove(self, actor: Actor, res: RepoResource, task: Task, comment_id: int) -> None:
        """Take one comment out of the caller's draft (the draft goes when its last comment does)."""
        rules.require_review(actor.principal, res, task)
        draft = await self.reviews.draft(actor.principal, task)
        comments = await self.reviews.draft_comments(draft) if draft is not None else []
        found = next((c for c in comments if c.id == comment_id), None)
        if draft is None or found is None:
            raise NotFound("no such comment in your review draft", code="review_comment_not_found")
        await self.session.delete(found)
        if len(comments) == 1:
            await self.session.delete(draft)
        await self.session.flush()
        audit.record(
            self.session, actor, "task.review_draft.remove", f"{res.full_name}#{task.number}", comment=comment_id
        )

    async def discard(self, actor: Actor, res: RepoResource, task: Task, review_id: int) -> None:
        """Throw the caller's draft `review_id` away, with its comments."""
        rules.require_review(actor.principal, res, task)
        draft = await self.reviews.draft(actor.principal, task)
        if draft is None or draft.id != review_id:
            raise NotFound(f"you have no pending review {review_id} of task #{task.number}", code="not_found")
        for c in await self.reviews.draft_comments(draft):
            await self.session.delete(c)
        await self.session.flush()  # the comments first: the draft's own delete cascades in the database
        await self.session.delete(draft)
        await self.session.flush()
        audit.record(
            self.session, actor, "task.review_draft.discard", f"{res.full_name}#{task.number}", review=review_id
        )
