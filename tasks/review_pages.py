"""The review page of a task: the diff under review with inline comment forms, the agent's
summary, the reviews so far (markdown, sanitised), the merge rules' verdict and the merge form.
Same services as the REST API; forms work without JavaScript."""

from typing import Any, Literal

import msgspec
from litestar import Controller, Request, get, post
from litestar.datastructures import State
from litestar.params import FromPath, URLEncodedBody
from litestar.response import Redirect, Template
from sqlalchemy.ext.asyncio import AsyncSession

from forge.access import Action, can
from forge.audit import Actor
from forge.deps import ActorDep, DatabaseDep
from forge.errors import ForgeError
from forge.pages import page
from forge.render import markdown_async
from tasks.pages import REPO_TASKS, _repo_ctx
from tasks.review_routes import merge_service, submit_review
from tasks.reviews import ReviewService
from tasks.routes import load_task
from tasks.schemas import MergeCreate, ReviewCommentCreate, ReviewCreate
from tasks.service import parse_number

VERDICTS = {"approve": "approved", "request_changes": "requested changes", "comment": "commented"}


class ReviewForm(msgspec.Struct, kw_only=True):
    verdict: str = "comment"
    body: str = ""
    # One inline comment (the per-line form), optional.
    path: str = ""
    side: str = "head"
    line: str = ""
    comment: str = ""
    commit_sha: str = ""
    csrf_token: str = ""


class MergeForm(msgspec.Struct, kw_only=True):
    strategy: str = "merge"
    expected_head_sha: str = ""
    csrf_token: str = ""


def _review_create(form: ReviewForm) -> ReviewCreate:
    verdict: Literal["approve", "request_changes", "comment"] = (
        "approve"
        if form.verdict == "approve"
        else "request_changes"
        if form.verdict == "request_changes"
        else "comment"
    )
    comments = []
    if form.path and form.line.isascii() and form.line.isdigit() and form.comment.strip():
        side: Literal["base", "head"] = "base" if form.side == "base" else "head"
        comments.append(
            ReviewCommentCreate(path=form.path[:4096], line=int(form.line[:9]), side=side, body=form.comment[:20_000])
        )
    return ReviewCreate(verdict=verdict, body=form.body[:50_000], commit_sha=form.commit_sha[:64], comments=comments)


def _merge_create(form: MergeForm) -> MergeCreate:
    strategy: Literal["merge", "squash", "fast-forward"] = (
        "squash" if form.strategy == "squash" else "fast-forward" if form.strategy == "fast-forward" else "merge"
    )
    return MergeCreate(strategy=strategy, expected_head_sha=form.expected_head_sha[:64])


async def _render(
    request: Request[Any, Any, Any],
    session: AsyncSession,
    actor: Actor,
    state: State,
    owner: str,
    name: str,
    n: int,
    *,
    error: str | None = None,
    status_code: int = 200,
) -> Template:
    res, svc, task = await load_task(session, state, actor, owner, name, n)
    reviews = ReviewService(svc)
    comparison = None
    diff_error = None
    if task.head_sha:
        try:
            comparison = await reviews.comparison(res, task)
        except ForgeError as exc:
            diff_error = exc.detail
    listed = await reviews.reviews(task)
    bodies = {r.id: await markdown_async(r.body) for r in listed if r.body}
    # Current-head comments under their lines: (path, side, line) -> comments.
    inline: dict[tuple[str, str, int], list[Any]] = {}
    for r in listed:
        for c in r.comments:
            if not c.outdated:
                inline.setdefault((c.path, c.side, c.line), []).append((r.author, c))
    return page(
        request,
        "tasks/review.html",
        status_code=status_code,
        task=await svc.to_read(task, res),
        cmp=comparison,
        diff_error=diff_error,
        reviews=listed,
        bodies=bodies,
        inline=inline,
        verdicts=VERDICTS,
        status=await reviews.status(task),
        summary_html=await markdown_async(task.summary) if task.summary else "",
        can_review=can(actor.principal, Action.REVIEW_WRITE, res),
        error=error,
        **_repo_ctx(res, actor.principal, svc.base_url),
    )


class ReviewPages(Controller):
    path = REPO_TASKS
    include_in_schema = False

    @get("/{number:str}/review")
    async def review_page(
        self,
        request: Request[Any, Any, Any],
        db: DatabaseDep,
        actor: ActorDep,
        state: State,
        owner: FromPath[str],
        name: FromPath[str],
        number: FromPath[str],
    ) -> Template:
        async with db.session() as s:
            return await _render(request, s, actor, state, owner, name, parse_number(number))

    @post("/{number:str}/reviews")
    async def submit(
        self,
        request: Request[Any, Any, Any],
        db: DatabaseDep,
        actor: ActorDep,
        state: State,
        owner: FromPath[str],
        name: FromPath[str],
        number: FromPath[str],
        data: URLEncodedBody[ReviewForm],
    ) -> Template | Redirect:
        n = parse_number(number)
        try:
            read, task_id = await submit_review(db, state, actor, owner, name, n, _review_create(data))
        except ForgeError as exc:
            if exc.status == 404:
                raise
            async with db.session() as s:
                return await _render(request, s, actor, state, owner, name, n, error=exc.detail, status_code=exc.status)
        state.tasks.changed(task_id)
        base = f"/{owner}/{name}/tasks/{n}"
        # A change request starts a run: follow it on the task page.
        return Redirect(base if read.run is not None else f"{base}/review#reviews", status_code=303)

    @post("/{number:str}/merge")
    async def merge(
        self,
        request: Request[Any, Any, Any],
        db: DatabaseDep,
        actor: ActorDep,
        state: State,
        owner: FromPath[str],
        name: FromPath[str],
        number: FromPath[str],
        data: URLEncodedBody[MergeForm],
    ) -> Template | Redirect:
        n = parse_number(number)
        try:
            task_id = await merge_service(db, state).merge(actor, owner, name, n, _merge_create(data))
        except ForgeError as exc:
            if exc.status == 404:
                raise
            async with db.session() as s:
                return await _render(request, s, actor, state, owner, name, n, error=exc.detail, status_code=exc.status)
        state.tasks.changed(task_id)
        return Redirect(f"/{owner}/{name}/tasks/{n}/review", status_code=303)
