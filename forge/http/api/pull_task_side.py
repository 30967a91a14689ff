"""REST: the pull request endpoints that, on a task's pull request, act on the task, as the pull
request's page does: a line comment (`POST .../pulls/{number}/comments`: a comment review of the
task, handed to the agent with the next change request), publishing a pending review (`POST
.../reviews/{id}/events`: the task's review with its draft) and discarding one (`DELETE
.../reviews/{id}`: the task's draft). The handlers open their own transactions: the task's services
open theirs, and must not wait behind the request's."""

from litestar.datastructures import State
from sqlalchemy.ext.asyncio import AsyncSession

from forge.core.error_codes import Code
from forge.core.errors import NotFound
from forge.db.audit import Actor
from forge.db.engine import Database
from forge.repos.pull_reviews import PullReviews
from forge.repos.pull_shapes import (
    PendingReviewSubmit,
    PullCommentCreate,
    PullCommentRead,
    PullReviewCommentCreate,
    PullReviewCreate,
    PullReviewRead,
)
from forge.repos.pull_tasks import TaskWork, task_number_of
from forge.repos.pulls import Pulls
from forge.repos.repositories import load


async def _task_of(state: State, actor: Actor, owner: str, name: str, number: int) -> int | None:
    """The task whose work the pull request holds (None: a person's, or no tasks composed in)."""
    if state.get("task_work") is None:
        return None
    async with state.db.session() as s:
        res = await load(s, actor.principal, owner, name)
        pulls = Pulls(s, state.repo_store, state.bus, state.settings.effective_base_url)
        return task_number_of((await pulls.get(res, number)).head_ref)


def _pulls(state: State, session: AsyncSession) -> Pulls:
    return Pulls(session, state.repo_store, state.bus, state.settings.effective_base_url, state.get("agent_work"))


async def comment(
    state: State, actor: Actor, owner: str, name: str, number: int, data: PullCommentCreate
) -> PullCommentRead:
    db: Database = state.db
    task_work: TaskWork | None = state.get("task_work")
    task = await _task_of(state, actor, owner, name, number)
    on_line = data.path is not None and data.line is not None and data.in_reply_to is None
    if task is not None and task_work is not None and on_line:
        return await _task_line_comment(task_work, actor, owner, name, task, data)
    async with db.session(write=True) as s:
        res = await load(s, actor.principal, owner, name)
        pulls = _pulls(state, s)
        reviews = PullReviews(pulls)
        row = await reviews.comment(actor, res, number, data)
        pull = await pulls.get(res, number)
        return next(c for c in await reviews.comments(res, pull, viewer=actor.principal.account_id) if c.id == row.id)


async def _task_line_comment(
    task_work: TaskWork, actor: Actor, owner: str, name: str, task: int, data: PullCommentCreate
) -> PullCommentRead:
    """A comment review of the task with the one line comment (the page's Comment now)."""
    assert data.path is not None and data.line is not None
    line = PullReviewCommentCreate(path=data.path, line=data.line, body=data.body, side=data.side)
    await task_work.review(actor, owner, name, task, PullReviewCreate(event="COMMENT", comments=[line]))
    side = await task_work.side(actor, owner, name, task)
    mine = [
        t.comment
        for t in side.comments
        if t.comment.user is not None
        and t.comment.user.login == actor.principal.login
        and (t.comment.path, t.comment.line, t.comment.body) == (data.path, data.line, data.body)
    ]
    return mine[-1]


async def publish(
    state: State, actor: Actor, owner: str, name: str, number: int, review_id: int, data: PendingReviewSubmit
) -> PullReviewRead:
    """Publish the caller's pending review with a verdict (on a task's pull request: the task's
    review, its draft's comments with it)."""
    task_work: TaskWork | None = state.get("task_work")
    task = await _task_of(state, actor, owner, name, number)
    if task is not None and task_work is not None:
        side = await task_work.side(actor, owner, name, task)
        if not any(r.id == review_id and r.state == "PENDING" for r in side.reviews):
            raise NotFound(f"you have no pending review {review_id} of #{number}", code=Code.NOT_FOUND)
        done = await task_work.review(actor, owner, name, task, PullReviewCreate(event=data.event, body=data.body))
        return next(r for r in await task_work.reviews(actor, owner, name, task) if r.id == done)
    async with state.db.session(write=True) as s:
        res = await load(s, actor.principal, owner, name)
        pulls = _pulls(state, s)
        reviews = PullReviews(pulls)
        review = await reviews.publish_pending(actor, res, number, review_id, data)
        pull = await pulls.get(res, number)
        return next(r for r in await reviews.reviews(res, pull, actor.principal.account_id) if r.id == review.id)


async def discard(state: State, actor: Actor, owner: str, name: str, number: int, review_id: int) -> None:
    """Discard the caller's pending review (on a task's pull request: their draft of the task's)."""
    task_work: TaskWork | None = state.get("task_work")
    task = await _task_of(state, actor, owner, name, number)
    if task is not None and task_work is not None:
        await task_work.discard(actor, owner, name, task, review_id)
        return
    async with state.db.session(write=True) as s:
        res = await load(s, actor.principal, owner, name)
        await PullReviews(_pulls(state, s)).discard_pending(actor, res, number, review_id)
