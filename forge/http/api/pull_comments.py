"""REST: a comment on a pull request (`POST .../pulls/{number}/comments`), on its conversation or on
a line. On a task's pull request a line comment is the task's (its review's comment, handed to the
agent with the next change request), as on the pull request's page; so the handler opens its own
transactions: the task's review opens its own, and must not wait behind the request's."""

from litestar.datastructures import State

from forge.db.audit import Actor
from forge.db.engine import Database
from forge.db.events import EventBus
from forge.git import RepoStore
from forge.repos.pull_reviews import PullReviews
from forge.repos.pull_shapes import PullCommentCreate, PullCommentRead, PullReviewCommentCreate, PullReviewCreate
from forge.repos.pull_tasks import TaskWork, task_number_of
from forge.repos.pulls import Pulls
from forge.repos.repositories import load


async def comment(
    state: State, actor: Actor, owner: str, name: str, number: int, data: PullCommentCreate
) -> PullCommentRead:
    db: Database = state.db
    store: RepoStore = state.repo_store
    bus: EventBus = state.bus
    url: str = state.settings.effective_base_url
    task_work: TaskWork | None = state.get("task_work")
    async with db.session() as s:
        res = await load(s, actor.principal, owner, name)
        task = task_number_of((await Pulls(s, store, bus, url).get(res, number)).head_ref)
    on_line = data.path is not None and data.line is not None and data.in_reply_to is None
    if task is not None and task_work is not None and on_line:
        return await _task_line_comment(task_work, actor, owner, name, task, data)
    async with db.session(write=True) as s:
        res = await load(s, actor.principal, owner, name)
        pulls = Pulls(s, store, bus, url, state.get("agent_work"))
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
