"""Web pages of pull requests: the Pull requests tab (open, closed, merged; by author), the form
that opens one (from the compare page), and a pull request's page: the description, the merge
box with every unmet rule in words, the conversation (reviews and comments), the changes with a
comment form on every line, and the review form. Same services as the REST API
(forge/repos/pulls.py); forms work without JavaScript; a refused form comes back as typed with
the reason beside the field it concerns."""

from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Literal

from litestar import Controller, Request, get, post
from litestar.params import FromPath, QueryParameter, URLEncodedBody
from litestar.response import Redirect, Template

from forge.core.access import Action
from forge.core.errors import ForgeError, InvalidInput, NotFound
from forge.db.audit import Actor
from forge.db.models import PullRequest, PullReview
from forge.http.deps import ActorDep, MergeRunnerDep, PullsDep, TaskWorkDep
from forge.http.pages.browse_render import ago, exact
from forge.http.pages.common import WebForm, or_form_error
from forge.http.pages.forms import NO_ERRORS, form_errors
from forge.http.pages.pull_forms import (
    CommentForm,
    MergeForm,
    OwnForm,
    ReviewForm,
    StateForm,
    line_comment,
    person_comment,
    person_review,
    review_spec,
    spec,
)
from forge.http.pages.pull_page import PullPage, PullTab
from forge.http.pages.repos import REPO, VIEWS, RepoView, RepoViews, ViewsDep
from forge.repos import statuses
from forge.repos.pull_merge import PullMerge
from forge.repos.pull_reviews import PullReviews
from forge.repos.pull_shapes import PullCreate, PullMergeRequest, PullUpdate, UpdateBranchRequest
from forge.repos.pull_suggestions import Suggestions
from forge.repos.pulls import Pulls, parse_number

ListQuery = Annotated[Literal["open", "closed", "merged", "all"], QueryParameter(name="state")]
AuthorQuery = Annotated[str | None, QueryParameter(name="author", max_length=40)]
ReviewerQuery = Annotated[str | None, QueryParameter(name="reviewer", max_length=40)]
BranchQuery = Annotated[str, QueryParameter(max_length=255)]
ViewQuery = Annotated[Literal["unified", "split"], QueryParameter(name="view")]


#: The pull request page's tabs by the last segment of their path (GitHub's).
TAB_PATHS: dict[str, PullTab] = {"": "conversation", "commits": "commits", "files": "files"}


class ReviewersForm(WebForm):
    reviewers: str = ""  # logins, separated by commas or spaces


class OpenForm(WebForm):
    title: str = ""
    body: str = ""
    head: str = ""
    base: str = ""
    draft: str = ""


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
        reviewer: ReviewerQuery = None,
    ) -> Template:
        view = await views.load()
        found = await pulls.reads(view.res, await pulls.page(view.res, state_, author=author, reviewer=reviewer))
        checks = await statuses.combined_states(
            pulls.session, view.res.repo.id, [p.head.sha for p in found if p.head.sha]
        )
        return view.render(
            "repos/pulls.html", tab="pulls", pulls=found, state=state_, author=author or "", reviewer=reviewer or "",
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
            return await pulls.open(actor, view.res, spec(raw, PullCreate))

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

    @get(["/pull/{number:str}", "/pull/{number:str}/{tab:str}"])
    async def pull_page(
        self,
        views: ViewsDep,
        pulls: PullsDep,
        task_work: TaskWorkDep,
        number: FromPath[str],
        tab: FromPath[str] = "",
        view_: ViewQuery = "unified",
    ) -> Template:
        """The pull request's page at GitHub's paths, one per tab: the conversation, `/commits` (the
        head's commits) and `/files` (Files changed; a task's review URL answers with a redirect
        here, so the fragment of an old link still finds its place). `?view=split` shows the diff
        side by side, as the compare and commit pages do. Another tab is a 404."""
        shown = TAB_PATHS.get(tab)
        if shown is None:
            raise NotFound(f"a pull request has no {tab!r} tab")
        view = await views.load()
        return await PullPage(view, pulls, task_work).render(parse_number(number), tab=shown, diff_view=view_)

    # The forms that may be a task's open transactions of their own (no `views`, no `db_session`):
    # a task's pull request is reviewed and merged through its task, whose service opens its own.

    @post("/pull/{number:str}/reviews")
    async def review(
        self, request: Request[Any, Any, Any], actor: ActorDep, merge_runner: MergeRunnerDep, task_work: TaskWorkDep,
        owner: FromPath[str], name: FromPath[str], number: FromPath[str], data: URLEncodedBody[ReviewForm],
    ) -> Template | Redirect:  # fmt: skip
        form = OwnForm(request, actor, merge_runner, task_work, owner, name, parse_number(number))

        async def submit() -> str:
            asked = review_spec(data)
            task = await form.task()
            if task is not None and task_work is not None:
                return f"#review-{await task_work.review(actor, owner, name, task, asked)}"
            review = await form.as_person(lambda reviews, res: person_review(reviews, actor, res, form.number, data))
            return f"#review-{review.id}"

        return await form.answer(submit(), "review", data, ("body", "event"))

    @post("/pull/{number:str}/comments")
    async def comment(
        self, request: Request[Any, Any, Any], actor: ActorDep, merge_runner: MergeRunnerDep, task_work: TaskWorkDep,
        owner: FromPath[str], name: FromPath[str], number: FromPath[str], data: URLEncodedBody[CommentForm],
    ) -> Template | Redirect:  # fmt: skip
        form = OwnForm(request, actor, merge_runner, task_work, owner, name, parse_number(number))

        async def comment() -> str:
            on_line = line_comment(data)
            task = await form.task() if on_line is not None else None
            if task is not None and task_work is not None and on_line is not None:  # the task's inline comment
                review_id = await task_work.review(actor, owner, name, task, on_line)
                return "#pending-review" if on_line.event is None else f"#review-{review_id}"
            row = await form.as_person(lambda reviews, res: person_comment(reviews, actor, res, form.number, data))
            return f"#review-{row.id}" if isinstance(row, PullReview) else f"#comment-{row.id}"

        which = "reply" if data.in_reply_to else "line-comment" if data.path else "comment"
        return await form.answer(comment(), which, data, ("body",))

    @post("/pull/{number:str}/reviews/{review_id:int}/discard")
    async def discard(
        self, request: Request[Any, Any, Any], actor: ActorDep, merge_runner: MergeRunnerDep, task_work: TaskWorkDep,
        owner: FromPath[str], name: FromPath[str], number: FromPath[str], review_id: FromPath[int],
        data: URLEncodedBody[WebForm],
    ) -> Template | Redirect:  # fmt: skip
        form = OwnForm(request, actor, merge_runner, task_work, owner, name, parse_number(number))

        async def discard() -> str:
            task = await form.task()
            if task is not None and task_work is not None:
                await task_work.discard(actor, owner, name, task, review_id)
            else:
                await form.as_person(lambda reviews, res: reviews.discard_pending(actor, res, form.number, review_id))
            return "#review"

        return await form.answer(discard(), "review", data, ())

    @post("/pull/{number:str}/merge")
    async def merge(
        self, request: Request[Any, Any, Any], actor: ActorDep, merge_runner: MergeRunnerDep, task_work: TaskWorkDep,
        owner: FromPath[str], name: FromPath[str], number: FromPath[str], data: URLEncodedBody[MergeForm],
    ) -> Template | Redirect:  # fmt: skip
        # The merge opens its own transactions around the `pre_merge` question, so no database lock
        # is held while a policy consumer answers.
        form = OwnForm(request, actor, merge_runner, task_work, owner, name, parse_number(number))

        async def merge() -> str:
            if data.strategy not in ("merge", "squash", "fast-forward"):
                raise InvalidInput("choose merge, squash or fast-forward", field="strategy")
            spec = PullMergeRequest(strategy=data.strategy, sha=data.sha or None)  # type: ignore[arg-type]
            await merge_runner.merge(actor, owner, name, form.number, spec)
            return ""

        return await form.answer(merge(), "merge", data, ("strategy",))

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

    @post("/pull/{number:str}/reviewers")
    async def request_reviewers(
        self, views: ViewsDep, pulls: PullsDep, actor: ActorDep, number: FromPath[str],
        data: URLEncodedBody[ReviewersForm],
    ) -> Template | Redirect:  # fmt: skip
        """Ask people or bots for a review (a bot asked starts a review task)."""

        async def ask(page: PullPage, view: RepoView, n: int) -> str:
            logins = [login for login in data.reviewers.replace(",", " ").split() if login]
            await PullReviews(page.pulls).request(actor, view.res, n, logins)
            return "#reviewers"

        return await _on_page(views, pulls, number, "reviewers", data, ("reviewers",), ask)


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
