"""A task's reviews and inline comments in its pull request's shapes (GitHub's names), as one
reader sees them: the published ones, and the reader's own pending review (a draft, seen by its
author only). Ids are the task's (`task_reviews`, `task_review_comments`), so a review's anchor on
the pull request's page (`#review-<id>`) is its id over the API."""

import msgspec
from sqlalchemy import or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from forge.db.events import AccountRef
from forge.db.models import Account
from forge.repos.pull_shapes import PullCommentRead, PullReviewRead, ReviewState
from forge.repos.pull_tasks import TaskLineComment
from tasks.core.models import Review, ReviewComment, Run, Task
from tasks.services.reviews import DRAFT

STATES: dict[str, ReviewState] = {
    "approve": "APPROVED",
    "request_changes": "CHANGES_REQUESTED",
    "comment": "COMMENTED",
    DRAFT: "PENDING",
}


class TaskReviewReads(msgspec.Struct, frozen=True, kw_only=True):
    reviews: list[PullReviewRead]
    comments: list[TaskLineComment]
    runs: dict[int, int]  # review id -> the sequence number of the run its change request started


async def _accounts(session: AsyncSession, ids: set[int]) -> dict[int, AccountRef]:
    if not ids:
        return {}
    rows = await session.execute(select(Account).where(Account.id.in_(ids)))
    return {a.id: AccountRef(login=a.login, type="Bot" if a.is_bot else "User") for a in rows.scalars()}


async def _rows(session: AsyncSession, task: Task, viewer: int | None) -> tuple[list[Review], list[ReviewComment]]:
    shown = Review.verdict != DRAFT if viewer is None else or_(Review.verdict != DRAFT, Review.author_id == viewer)
    stmt = select(Review).where(Review.task_id == task.id, shown).order_by(Review.id)
    reviews = list((await session.execute(stmt)).scalars().all())
    if not reviews:
        return reviews, []
    found = select(ReviewComment).where(ReviewComment.review_id.in_([r.id for r in reviews])).order_by(ReviewComment.id)
    return reviews, list((await session.execute(found)).scalars().all())


def _comment(c: ReviewComment, author: AccountRef | None, task: Task, url: str) -> PullCommentRead:
    return PullCommentRead(
        id=c.id,
        user=author,
        body=c.body,
        path=c.path,
        line=c.line,
        side="LEFT" if c.side == "base" else "RIGHT",
        commit_id=c.commit_sha,
        pull_request_review_id=c.review_id,
        outdated=c.commit_sha != task.head_sha,
        suggestion=None,  # the agent makes the changes a review asks for
        in_reply_to_id=None,
        resolved=False,
        resolved_by=None,
        created_at=c.created_at,
        updated_at=c.created_at,
        html_url=f"{url}#task-comment-{c.id}",
    )


async def task_review_reads(
    session: AsyncSession, task: Task, viewer: int | None, url: str, *, quoted: bool
) -> TaskReviewReads:
    """The task's reviews and their inline comments for `viewer` (whose pending review is
    included), linked to the pull request's page `url`. `quoted=False` blanks the quoted lines (a
    reader without `repo:read`)."""
    reviews, comments = await _rows(session, task, viewer)
    authors = await _accounts(session, {r.author_id for r in reviews if r.author_id})
    run_ids = {r.run_id for r in reviews if r.run_id is not None}
    seqs: dict[int, int] = {}
    if run_ids:
        seqs = dict((await session.execute(select(Run.id, Run.seq).where(Run.id.in_(run_ids)))).tuples().all())
    by_id = {r.id: r for r in reviews}
    return TaskReviewReads(
        reviews=[_review(r, authors, url) for r in reviews if r.verdict in STATES],
        comments=[
            TaskLineComment(
                comment=_comment(c, _author(by_id[c.review_id], authors), task, url),
                quoted=c.quoted if quoted else "",
                pending=by_id[c.review_id].verdict == DRAFT,
            )
            for c in comments
        ],
        runs={r.id: seqs[r.run_id] for r in reviews if r.run_id is not None and r.run_id in seqs},
    )


def _author(review: Review, authors: dict[int, AccountRef]) -> AccountRef | None:
    return authors.get(review.author_id) if review.author_id else None


def _review(r: Review, authors: dict[int, AccountRef], url: str) -> PullReviewRead:
    return PullReviewRead(
        id=r.id,
        user=_author(r, authors),
        body=r.body,
        state=STATES[r.verdict],
        commit_id=r.commit_sha,
        submitted_at=r.created_at,
        html_url=f"{url}#review-{r.id}",
    )
