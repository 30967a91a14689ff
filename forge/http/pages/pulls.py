"""Web pages of pull requests: the Pull requests tab (open, closed, merged; by author), the form
that opens one (from the compare page), and a pull request's page: the description, the merge
box with every unmet rule in words, the conversation (reviews and comments), the changes with a
comment form on every line, and the review form. Same services as the REST API
(forge/repos/pulls.py); forms work without JavaScript; a refused form comes back as typed with
the reason beside the field it concerns."""

from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Literal, TypeVar

import msgspec
from litestar import Controller, Request, get, post
from litestar.params import FromPath, QueryParameter, URLEncodedBody
from litestar.response import Redirect, Template

from forge.core.access import Action
from forge.core.errors import ForgeError, InvalidInput
from forge.db.audit import Actor
from forge.db.models import PullComment, PullRequest, PullReview
from forge.http.deps import ActorDep, MergeRunnerDep, PullsDep, TaskWorkDep
from forge.http.pages.browse_render import ago, exact
from forge.http.pages.common import WebForm, or_form_error
from forge.http.pages.forms import NO_ERRORS, form_errors, invalid_input
from forge.http.pages.pull_page import PullPage
from forge.http.pages.repos import REPO, VIEWS, RepoView, RepoViews, ViewsDep
from forge.repos import repositories, statuses
from forge.repos.pull_merge import PullMerge
from forge.repos.pull_reviews import PullReviews
from forge.repos.pull_shapes import (
    PendingReviewSubmit,
    PullCommentCreate,
    PullCreate,
    PullMergeRequest,
    PullReviewCreate,
    PullUpdate,
    UpdateBranchRequest,
)
from forge.repos.pull_suggestions import Suggestions
from forge.repos.pull_tasks import task_number_of
from forge.repos.pulls import Pulls, parse_number
from forge.repos.repositories import RepoResource

_S = TypeVar("_S")
ListQuery = Annotated[Literal["open", "closed", "merged", "all"], QueryParameter(name="state")]
AuthorQuery = Annotated[str | None, QueryParameter(name="author", max_length=40)]
BranchQuery = Annotated[str, QueryParameter(max_length=255)]


class OpenForm(WebForm):
    title: str = ""
    body: str = ""
    head: str = ""
    base: str = ""
    draft: str = ""


class ReviewForm(WebForm):
    event: str = "COMMENT"
    body: str = ""
    commit_id: str = ""


class CommentForm(WebForm):
    body: str = ""
    path: str = ""
    line: str = ""
    side: str = "RIGHT"
    in_reply_to: str = ""
    mode: str = ""  # "review": into the author's pending review instead of at once


def _spec(raw: dict[str, Any], shape: type[_S]) -> _S:
    """A form as the API's body, checked against the same schema (same limits, same messages)."""
    try:
        return msgspec.convert(raw, shape)
    except msgspec.ValidationError as exc:
        raise invalid_input(exc) from None


def _number(raw: str, field: str) -> int | None:
    """A whole number a form sent (a line, a comment id), or None; anything else is refused."""
    if not raw:
        return None
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 9):
        raise InvalidInput(f"{raw[:20]!r} is not a number", field=field)
    return int(raw)


class MergeForm(WebForm):
    strategy: str = "merge"
    sha: str = ""


class StateForm(WebForm):
    state: str = ""  # closed | open | ready
    expected_head_sha: str = ""


async def _review(reviews: PullReviews, actor: Actor, res: RepoResource, n: int, data: ReviewForm) -> PullReview:
    """A person's pull request reviewed from the page: their pending review published with the
    verdict, or a review of its own."""
    pending = await reviews.pending_of(await reviews.pulls.get(res, n), actor.principal.account_id)
    if pending is not None:
        publish = _spec({"event": data.event, "body": data.body}, PendingReviewSubmit)
        return await reviews.publish_pending(actor, res, n, pending.id, publish)
    raw = {"event": data.event, "body": data.body, "commit_id": data.commit_id or None}
    return await reviews.submit(actor, res, n, _spec(raw, PullReviewCreate))


class PullPages(Controller):
    path = REPO
    include_in_schema = False
    dependencies = VIEWS

    @get("/pulls")
    async def list_page(
        self,
        views: ViewsDep,
        pulls: PullsDep,
        state_: ListQuery = "open",
        author: AuthorQuery = None,
    ) -> Template:
        view = await views.load()
        found = await pulls.reads(view.res, await pulls.page(view.res, state_, author=author))
        checks = await statuses.combined_states(
            pulls.session, view.res.repo.id, [p.head.sha for p in found if p.head.sha]
        )
        return view.render(
            "repos/pulls.html", tab="pulls", pulls=found, state=state_, author=author or "",
            counts=await pulls.counts(view.res), checks=checks, ago=ago, exact=exact,
        )  # fmt: skip

    @get("/pulls/new")
    async def new_page(self, views: ViewsDep, base: BranchQuery = "", head: BranchQuery = "") -> Template:
        view = await views.load(Action.PULL_WRITE)
        form = OpenForm(base=base or view.res.repo.default_branch, head=head)
        return view.render("repos/pull_new.html", tab="pulls", form=form, errors=NO_ERRORS)

    @post("/pulls")
    async def open_pull(
        self,
        views: ViewsDep,
        pulls: PullsDep,
        actor: ActorDep,
        data: URLEncodedBody[OpenForm],
    ) -> Template | Redirect:
        view = await views.load()

        async def open_it() -> PullRequest:
            raw = {"title": data.title.strip()[:256] or data.head, "head": data.head, "base": data.base,
                   "body": data.body, "draft": bool(data.draft)}  # fmt: skip
            return await pulls.open(actor, view.res, _spec(raw, PullCreate))

        async def again(exc: ForgeError) -> Template:
            errors = form_errors(exc, ("title", "body", "head", "base"), {"no_commits_between": "head"})
            return view.render("repos/pull_new.html", exc.status, tab="pulls", form=data, errors=errors)

        pull = await or_form_error(open_it(), again, raise_404=False)
        if isinstance(pull, Template):
            return pull
        return Redirect(f"/{view.res.full_name}/pull/{pull.number}", status_code=303)

    @get("/pulls/{number:str}")
    async def gitea_path(self, views: ViewsDep, number: FromPath[str]) -> Redirect:
        view = await views.load()
        return Redirect(f"/{view.res.full_name}/pull/{parse_number(number)}", status_code=301)

    @get("/pull/{number:str}")
    async def pull_page(
        self,
        views: ViewsDep,
        pulls: PullsDep,
        task_work: TaskWorkDep,
        number: FromPath[str],
    ) -> Template:
        view = await views.load()
        page = PullPage(view, pulls, task_work)
        return await page.render(parse_number(number))

    @post("/pull/{number:str}/reviews")
    async def review(
        self, request: Request[Any, Any, Any], actor: ActorDep, merge_runner: MergeRunnerDep, task_work: TaskWorkDep,
        owner: FromPath[str], name: FromPath[str], number: FromPath[str], data: URLEncodedBody[ReviewForm],
    ) -> Template | Redirect:  # fmt: skip
        # Transactions of its own (no `views`, no `db_session`): a task's pull request is reviewed
        # through its task, whose service opens its own.
        n, db, store, bus = parse_number(number), merge_runner.db, merge_runner.store, merge_runner.bus

        async def submit() -> int:
            if data.event not in ("APPROVE", "REQUEST_CHANGES", "COMMENT"):
                raise InvalidInput("choose Comment, Approve or Request changes", field="event")
            async with db.session() as s:
                res = await repositories.load(s, actor.principal, owner, name)
                task = task_number_of((await Pulls(s, store, bus, merge_runner.base_url).get(res, n)).head_ref)
            if task is not None and task_work is not None:
                raw = {"event": data.event, "body": data.body, "commit_id": data.commit_id or None}
                return await task_work.review(actor, owner, name, task, _spec(raw, PullReviewCreate))
            async with db.session(write=True) as s:
                res = await repositories.load(s, actor.principal, owner, name)
                return (await _review(PullReviews(Pulls(s, store, bus, merge_runner.base_url)), actor, res, n, data)).id

        async def again(exc: ForgeError) -> Template:
            async with db.session() as s:
                res = await repositories.load(s, actor.principal, owner, name)
                view = RepoView(request, res, actor.principal, merge_runner.base_url)
                page = PullPage(view, Pulls(s, store, bus, view.base_url), task_work)
                return await page.again(n, "review", data, ("body", "event"), rollback=False)(exc)

        review = await or_form_error(submit(), again, raise_404=False)
        if isinstance(review, Template):
            return review
        return Redirect(f"/{owner}/{name}/pull/{n}#review-{review}", status_code=303)

    @post("/pull/{number:str}/comments")
    async def comment(
        self, views: ViewsDep, pulls: PullsDep, actor: ActorDep, number: FromPath[str],
        data: URLEncodedBody[CommentForm],
    ) -> Template | Redirect:  # fmt: skip
        async def comment(page: PullPage, view: RepoView, n: int) -> str:
            row = await _comment(PullReviews(page.pulls), actor, view.res, n, data)
            return f"#review-{row.id}" if isinstance(row, PullReview) else f"#comment-{row.id}"

        form = "reply" if data.in_reply_to else "line-comment" if data.path else "comment"
        return await _on_page(views, pulls, number, form, data, ("body",), comment)

    @post("/pull/{number:str}/reviews/{review_id:int}/discard")
    async def discard(
        self, views: ViewsDep, pulls: PullsDep, actor: ActorDep, number: FromPath[str], review_id: FromPath[int],
        data: URLEncodedBody[WebForm],
    ) -> Template | Redirect:  # fmt: skip
        async def discard(page: PullPage, view: RepoView, n: int) -> str:
            await PullReviews(page.pulls).discard_pending(actor, view.res, n, review_id)
            return "#review"

        return await _on_page(views, pulls, number, "review", data, (), discard)

    @post("/pull/{number:str}/merge")
    async def merge(
        self, request: Request[Any, Any, Any], actor: ActorDep, merge_runner: MergeRunnerDep, task_work: TaskWorkDep,
        owner: FromPath[str], name: FromPath[str], number: FromPath[str], data: URLEncodedBody[MergeForm],
    ) -> Template | Redirect:  # fmt: skip
        # No request transaction (no `views`, no `db_session`): the merge opens its own around the
        # `pre_merge` question, so no database lock is held while a policy consumer answers.
        n = parse_number(number)

        async def merge() -> PullRequest:
            if data.strategy not in ("merge", "squash", "fast-forward"):
                raise InvalidInput("choose merge, squash or fast-forward", field="strategy")
            spec = PullMergeRequest(strategy=data.strategy, sha=data.sha or None)  # type: ignore[arg-type]
            return await merge_runner.merge(actor, owner, name, n, spec)

        async def again(exc: ForgeError) -> Template:
            async with merge_runner.db.session() as s:
                res = await repositories.load(s, actor.principal, owner, name)
                view = RepoView(request, res, actor.principal, merge_runner.base_url)
                page = PullPage(view, Pulls(s, merge_runner.store, merge_runner.bus, view.base_url), task_work)
                return await page.again(n, "merge", data, ("strategy",), rollback=False)(exc)

        merged = await or_form_error(merge(), again, raise_404=False)
        if isinstance(merged, Template):
            return merged
        return Redirect(f"/{owner}/{name}/pull/{n}", status_code=303)

    @post("/pull/{number:str}/comments/{comment_id:int}/apply")
    async def apply_suggestion(
        self, views: ViewsDep, pulls: PullsDep, actor: ActorDep, number: FromPath[str], comment_id: FromPath[int],
        data: URLEncodedBody[WebForm],
    ) -> Template | Redirect:  # fmt: skip
        async def apply(page: PullPage, view: RepoView, n: int) -> str:
            await Suggestions(page.pulls).apply(actor, view.res, n, comment_id)
            return "#files"

        return await _on_page(views, pulls, number, "suggestion", data, (), apply)

    @post("/pull/{number:str}/comments/{comment_id:int}/{change:str}")
    async def thread(
        self, views: ViewsDep, pulls: PullsDep, actor: ActorDep, number: FromPath[str], comment_id: FromPath[int],
        change: FromPath[str], data: URLEncodedBody[WebForm],
    ) -> Template | Redirect:  # fmt: skip
        async def resolve(page: PullPage, view: RepoView, n: int) -> str:
            if change not in ("resolve", "unresolve"):
                raise InvalidInput("resolve or unresolve a thread")
            await PullReviews(page.pulls).resolve(actor, view.res, n, comment_id, resolved=change == "resolve")
            return f"#comment-{comment_id}"

        return await _on_page(views, pulls, number, "thread", data, (), resolve)

    @post("/pull/{number:str}/state")
    async def change_state(
        self, views: ViewsDep, pulls: PullsDep, actor: ActorDep, number: FromPath[str],
        data: URLEncodedBody[StateForm],
    ) -> Template | Redirect:  # fmt: skip
        async def change(page: PullPage, view: RepoView, n: int) -> str:
            await _change(page.pulls, actor, view, n, data)
            return ""

        return await _on_page(views, pulls, number, "state", data, (), change)


async def _on_page(
    views: RepoViews,
    pulls: Pulls,
    number: str,
    form: str,
    typed: WebForm,
    inputs: tuple[str, ...],
    act: Callable[[PullPage, RepoView, int], Awaitable[str]],
) -> Template | Redirect:
    """A form of a pull request's page: `act` (which returns the anchor to show), then back to the
    page; refused, the page again with the form as typed and the reason beside its input."""
    view = await views.load()
    page = PullPage(view, pulls)
    n = parse_number(number)
    anchor = await or_form_error(act(page, view, n), page.again(n, form, typed, inputs), raise_404=False)
    if isinstance(anchor, Template):
        return anchor
    return Redirect(f"/{view.res.full_name}/pull/{n}{anchor}", status_code=303)


async def _comment(
    reviews: PullReviews, actor: Actor, res: RepoResource, n: int, data: CommentForm
) -> PullComment | PullReview:
    """The comment form: a conversation comment, a line comment (now, or into the pending review) or a reply."""
    reply_to = _number(data.in_reply_to, "body")
    on_line = bool(data.path) and reply_to is None
    line = _number(data.line, "body") if on_line else None
    if on_line and line is None:
        raise InvalidInput("a line comment names its line", field="body")
    if not data.body.strip():
        raise InvalidInput("write a comment first", field="body")
    side = "LEFT" if data.side == "LEFT" else "RIGHT"
    if on_line and data.mode == "review":  # gathered in the author's pending review
        one = {"path": data.path, "line": line, "side": side, "body": data.body.strip()}
        return await reviews.submit(actor, res, n, _spec({"comments": [one]}, PullReviewCreate))
    raw = {"body": data.body.strip(), "path": data.path if on_line else None, "line": line, "side": side,
           "in_reply_to": reply_to}  # fmt: skip
    return await reviews.comment(actor, res, n, _spec(raw, PullCommentCreate))


async def _change(pulls: Pulls, actor: Actor, view: RepoView, number: int, data: StateForm) -> None:
    if data.state == "update-branch":
        spec = UpdateBranchRequest(expected_head_sha=data.expected_head_sha or None)
        await PullMerge(pulls).update_branch(actor, view.res, number, spec)
    elif data.state == "ready":
        await pulls.edit(actor, view.res, number, PullUpdate(draft=False))
    elif data.state in ("open", "closed"):
        await pulls.edit(actor, view.res, number, PullUpdate(state=data.state))  # type: ignore[arg-type]
    else:
        raise InvalidInput("unknown change")
