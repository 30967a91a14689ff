"""A review task's result (docs/tasks.md, "Review tasks"): the `submit_review` tool posts the
task's bot's review of the pull request the task was asked to review, through the review
machinery people use (`forge.repos.pull_reviews.PullReviews.submit`: the write role, line comments
on lines the diff shows, the head the review read, `pull_request.review_submitted`).

The agent is not trusted with anything here: the pull request is the task's trigger's (read from
the task, never from the arguments), the review binds to the head the task checked out (a head
that moved since is refused), sizes and counts are capped before anything is read, secrets the
run knows are redacted from the text, `approve` is refused unless the repository lets agents
approve (task settings `review_agents_may_approve`, off by default), and a refused review keeps
nothing (its transaction rolls back)."""

from collections.abc import Callable
from typing import Annotated, Any, Literal

import msgspec
from sqlalchemy.ext.asyncio import AsyncSession

from forge.core.access import Principal
from forge.core.errors import ForgeError
from forge.db.audit import Actor
from forge.db.engine import Database
from forge.db.models import Account, Repository
from forge.db.payload_base import TriggerRef
from forge.git import RepoStore
from forge.repos.pull_reviews import PullReviews
from forge.repos.pull_shapes import PullReviewCommentCreate, PullReviewCreate
from forge.repos.pulls import Pulls
from forge.repos.repositories import resource_for
from tasks.core import repo_settings
from tasks.core.lifecycle import Lifecycle
from tasks.core.models import Task

BODY_MAX = 20_000
COMMENTS_MAX = 50
COMMENT_MAX = 5_000
PATH_MAX = 1_000
_EVENTS = {"comment": "COMMENT", "request_changes": "REQUEST_CHANGES", "approve": "APPROVE"}


class ReviewRefused(Exception):
    """The review is refused; the message is for the agent (nothing was posted)."""


class LineComment(msgspec.Struct, kw_only=True):
    path: Annotated[str, msgspec.Meta(min_length=1, max_length=PATH_MAX)]
    line: Annotated[int, msgspec.Meta(ge=1, le=10_000_000)]
    body: Annotated[str, msgspec.Meta(min_length=1, max_length=COMMENT_MAX)]
    side: Literal["RIGHT", "LEFT"] = "RIGHT"


class ReviewInput(msgspec.Struct, kw_only=True):
    verdict: Literal["comment", "request_changes", "approve"]
    body: Annotated[str, msgspec.Meta(max_length=BODY_MAX)] = ""
    comments: Annotated[list[LineComment], msgspec.Meta(max_length=COMMENTS_MAX)] = []


def parse(args: dict[str, Any]) -> ReviewInput:
    """The arguments, strictly: the named fields only (a pull request number or anything else is
    ignored), each within its size, no NUL."""
    raw = {k: args[k] for k in ("verdict", "body", "comments") if k in args}
    comments = raw.get("comments")
    if isinstance(comments, list) and len(comments) <= COMMENTS_MAX:
        raw["comments"] = [
            {k: c[k] for k in ("path", "line", "body", "side") if k in c} if isinstance(c, dict) else c
            for c in comments
        ]
    try:
        data = msgspec.convert(raw, ReviewInput)
    except msgspec.ValidationError as exc:
        raise ReviewRefused(
            f"error: {exc}. Send verdict (comment or request_changes), body (at most {BODY_MAX} characters) and "
            f"comments (at most {COMMENTS_MAX}: path, line, side RIGHT or LEFT, body of at most {COMMENT_MAX})"
        ) from None
    texts = [data.body, *(c.body for c in data.comments), *(c.path for c in data.comments)]
    if any("\x00" in t for t in texts):
        raise ReviewRefused("error: the review's text may not contain NUL")
    return data


def reviewed_pull(trigger: object) -> int | None:
    """The pull request a task reviews: its trigger's, when the trigger is a review request."""
    if not isinstance(trigger, dict):
        return None
    try:
        ref = msgspec.convert(trigger, TriggerRef)
    except msgspec.ValidationError:
        return None
    return ref.pull_request.number if ref.kind == "review_request" and ref.pull_request is not None else None


async def _bot(s: AsyncSession, task: Task) -> Actor:
    bot = await s.get(Account, task.agent_id)
    login = bot.login if bot is not None else ""
    return Actor(principal=Principal(account_id=task.agent_id, login=login, type="Bot", via="internal"))


async def post(
    db: Database, lifecycle: Callable[[AsyncSession], Lifecycle], store: RepoStore, task_id: int,
    data: ReviewInput, redact: Callable[[str], str],
) -> tuple[int, int]:  # fmt: skip
    """Post the review as the task's bot on its trigger's pull request: (pull request, review id)."""
    async with db.session(write=True) as s:
        task = await s.get(Task, task_id)
        repo = await s.get(Repository, task.repo_id) if task is not None else None
        number = reviewed_pull(task.trigger) if task is not None else None
        if task is None or repo is None or number is None:
            raise ReviewRefused("error: submit_review is for review tasks only (a task asked to review a pull request)")
        if data.verdict == "approve":
            merge = await repo_settings.merge_rules(s, repo.id)
            if not merge.review_agents_may_approve:
                raise ReviewRefused(
                    "error: agents may not approve pull requests in this repository: use comment or request_changes "
                    "(a repository admin can allow approvals by agents in the task settings)"
                )
        actor = await _bot(s, task)
        res = await resource_for(s, repo, actor.principal)
        life = lifecycle(s)
        review = PullReviewCreate(
            event=_EVENTS[data.verdict],  # type: ignore[arg-type]
            body=redact(data.body),
            commit_id=task.base_sha,  # the head the task checked out: a head that moved is refused
            comments=[
                PullReviewCommentCreate(path=c.path, line=c.line, side=c.side, body=redact(c.body))
                for c in data.comments
            ],
        )
        try:
            row = await PullReviews(Pulls(s, store, life.bus, life.base_url)).submit(actor, res, number, review)
        except ForgeError as exc:
            raise ReviewRefused(f"error: the review was not posted: {exc.detail}") from None
        return number, row.id
