"""Web pages of issues: the Issues tab (open, closed; by label, assignee, author, milestone and
words), the form that opens one, and an issue's page: the description, the timeline (comments and
events), the comment box, and the sidebar (assignees, labels, milestone, linked pull requests).
Same services as the REST API (forge/repos/issues.py); forms work without JavaScript; a refused
form comes back as typed with the reason beside its field. Labels and milestones pages are
`forge.http.pages.labels`."""

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import msgspec
from litestar import Controller, MediaType, Response, get, post
from litestar.di import NamedDependency, Provide
from litestar.params import FromPath, QueryParameter, URLEncodedBody
from litestar.response import Redirect, Template
from markupsafe import Markup
from sqlalchemy import select

from forge.core.access import Action, can
from forge.core.errors import ForgeError
from forge.db.audit import Actor
from forge.db.models import PullRequest
from forge.http.deps import ActorDep, IssueCommentsDep, IssuesDep, LabelsDep
from forge.http.pages.browse_render import ago, exact
from forge.http.pages.common import WebForm, or_form_error
from forge.http.pages.forms import NO_ERRORS, FormErrors, form_errors, invalid_input
from forge.http.pages.render import markdown
from forge.http.pages.repos import REPO, VIEWS, RepoView, RepoViews, ViewsDep
from forge.repos.issue_base import parse_number
from forge.repos.issue_comments import IssueComments
from forge.repos.issue_shapes import IssueCreate, IssueUpdate
from forge.repos.issues import IssueFilter, Issues
from forge.repos.labels import Labels

StateQuery = Annotated[Literal["open", "closed", "all"], QueryParameter(name="state")]
TextQuery = Annotated[str, QueryParameter(max_length=200)]
LoginQuery = Annotated[str, QueryParameter(max_length=40)]
LabelQuery = Annotated[str, QueryParameter(name="label", max_length=50)]
MilestoneQuery = Annotated[int | None, QueryParameter(ge=1, le=1_000_000_000)]
SortQuery = Annotated[Literal["created", "updated", "comments"], QueryParameter()]


class NewIssueForm(WebForm):
    title: str = ""
    body: str = ""


class PreviewForm(WebForm):
    body: str = ""


class CommentForm(WebForm):
    body: str = ""
    close: str = ""  # "completed" | "not_planned" | "duplicate": comment, then close


class StateForm(WebForm):
    state: str = "closed"
    state_reason: str = "completed"


class SidebarForm(WebForm):
    """Labels (checkboxes), assignees (logins separated by commas or spaces) and the milestone."""

    labels: list[str] | str = []  # one checked box arrives as a string
    assignees: str = ""
    milestone: str = "0"
    sidebar: str = ""  # which part was posted: labels | assignees | milestone


class EditForm(WebForm):
    title: str = ""
    body: str = ""


def _spec(raw: dict[str, Any], shape: type[msgspec.Struct]) -> Any:
    try:
        return msgspec.convert(raw, shape)
    except msgspec.ValidationError as exc:
        raise invalid_input(exc) from None


def md(view: RepoView, text: str) -> Markup:
    """The sanitiser of agent markdown (scripts, event handlers, foreign images and `javascript:`
    links go), with `#N` and `@login` linked."""
    return markdown(text, remote_images=False, repo_url=f"/{view.res.full_name}")


@dataclass
class IssueForms:
    """What every form of an issue's page needs: the page of the repository the path names, loaded
    through the access rule."""

    views: RepoViews
    issues: Issues
    comments: IssueComments
    labels: Labels

    async def load(self) -> "IssuePage":  # defined below, beside the page it renders
        return IssuePage(await self.views.load(), self.issues, self.comments, self.labels)


def provide_issue_forms(
    views: ViewsDep, issues: IssuesDep, issue_comments: IssueCommentsDep, repo_labels: LabelsDep
) -> IssueForms:
    return IssueForms(views, issues, issue_comments, repo_labels)


IssueFormsDep = NamedDependency[IssueForms]


class IssuePages(Controller):
    path = REPO
    include_in_schema = False
    dependencies = {**VIEWS, "forms": Provide(provide_issue_forms, sync_to_thread=False)}

    @get("/issues")
    async def list_page(
        self,
        views: ViewsDep,
        issues: IssuesDep,
        repo_labels: LabelsDep,
        state_: StateQuery = "open",
        label: LabelQuery = "",
        assignee: LoginQuery = "",
        author: LoginQuery = "",
        milestone: MilestoneQuery = None,
        q: TextQuery = "",
        sort: SortQuery = "created",
    ) -> Template:
        view = await views.load()
        f = IssueFilter(
            state=state_, labels=(label,) if label else (), assignee=assignee or None, author=author or None,
            milestone=milestone, q=q, sort=sort,
        )  # fmt: skip
        found = await issues.reads(view.res, await issues.page(view.res, f))
        return view.render(
            "repos/issues.html", tab="issues", issues=found, f=f, counts=await issues.counts(view.res),
            labels=await repo_labels.all(view.res), milestones=await repo_labels.milestones(view.res, "all"),
            can_open=can(view.principal, Action.ISSUE_WRITE, view.res), ago=ago, exact=exact,
        )  # fmt: skip

    @post("/markdown")
    async def preview(self, views: ViewsDep, data: URLEncodedBody[PreviewForm]) -> Response[str]:
        """The comment box's preview: the text as the page will show it (same sanitiser)."""
        view = await views.load()
        return Response(str(md(view, data.body[:65_536])), media_type=MediaType.HTML)

    @get("/issues/new")
    async def new_page(self, views: ViewsDep) -> Template:
        view = await views.load(Action.ISSUE_WRITE)
        return view.render("repos/issue_new.html", tab="issues", form=NewIssueForm(), errors=NO_ERRORS)

    @post("/issues")
    async def open_issue(
        self, views: ViewsDep, issues: IssuesDep, actor: ActorDep, data: URLEncodedBody[NewIssueForm]
    ) -> Template | Redirect:
        view = await views.load()

        async def open_it() -> int:
            spec = _spec({"title": data.title, "body": data.body}, IssueCreate)
            return (await issues.open(actor, view.res, spec)).number

        async def again(exc: ForgeError) -> Template:
            errors = form_errors(exc, ("title", "body"))
            return view.render("repos/issue_new.html", exc.status, tab="issues", form=data, errors=errors)

        number = await or_form_error(open_it(), again, raise_404=False)
        if isinstance(number, Template):
            return number
        return Redirect(f"/{view.res.full_name}/issues/{number}", status_code=303)

    @get("/issues/{number:str}")
    async def issue_page(
        self,
        forms: IssueFormsDep,
        number: FromPath[str],
    ) -> Template | Redirect:
        ipage = await forms.load()
        view = ipage.view
        n = parse_number(number)
        pull = await ipage.issues.session.scalar(
            select(PullRequest.number).where(PullRequest.repo_id == view.res.repo.id, PullRequest.number == n)
        )
        if pull is not None:  # numbers are shared: `#N` of a pull request leads to it
            return Redirect(f"/{view.res.full_name}/pull/{n}", status_code=303)
        return await ipage.render(n)

    @post("/issues/{number:str}/comments")
    async def comment(
        self,
        forms: IssueFormsDep,
        actor: ActorDep,
        number: FromPath[str],
        data: URLEncodedBody[CommentForm],
    ) -> Template | Redirect:
        ipage = await forms.load()
        view = ipage.view

        async def act(n: int) -> str:
            issue = await ipage.issues.get(view.res, n, lock=True)
            anchor = "#timeline"
            if data.body.strip():
                made = await ipage.comments.create(
                    actor, view.res, issue, _spec({"body": data.body}, CommentBodyForm).body
                )
                anchor = f"#issuecomment-{made.id}"
            if data.close:
                await ipage.issues.update(
                    actor, view.res, n, _spec({"state": "closed", "state_reason": data.close}, IssueUpdate)
                )
            return anchor

        return await ipage.answer(act(parse_number(number)), parse_number(number), "comment", data)

    @post("/issues/{number:str}/state")
    async def state(
        self,
        forms: IssueFormsDep,
        actor: ActorDep,
        number: FromPath[str],
        data: URLEncodedBody[StateForm],
    ) -> Template | Redirect:
        raw = {"state": data.state} | ({"state_reason": data.state_reason} if data.state == "closed" else {})
        return await (await forms.load()).update(actor, number, lambda: raw, "#timeline", "state", data)

    @post("/issues/{number:str}/edit")
    async def edit(
        self,
        forms: IssueFormsDep,
        actor: ActorDep,
        number: FromPath[str],
        data: URLEncodedBody[EditForm],
    ) -> Template | Redirect:
        change = {"title": data.title, "body": data.body}
        return await (await forms.load()).update(actor, number, lambda: change, "", "edit", data)

    @post("/issues/{number:str}/sidebar")
    async def sidebar(
        self,
        forms: IssueFormsDep,
        actor: ActorDep,
        number: FromPath[str],
        data: URLEncodedBody[SidebarForm],
    ) -> Template | Redirect:
        ipage = await forms.load()
        return await ipage.update(
            actor, number, lambda: _sidebar_change(data), "#sidebar", data.sidebar or "sidebar", data
        )

    @post("/issues/comments/{comment_id:int}/edit")
    async def edit_comment(
        self,
        forms: IssueFormsDep,
        actor: ActorDep,
        comment_id: FromPath[int],
        data: URLEncodedBody[CommentForm],
    ) -> Template | Redirect:
        ipage = await forms.load()
        view = ipage.view
        _, issue = await ipage.comments.find(view.res, comment_id)

        async def act() -> str:
            await ipage.comments.edit(actor, view.res, comment_id, _spec({"body": data.body}, CommentBodyForm).body)
            return f"#issuecomment-{comment_id}"

        return await ipage.answer(act(), issue.number, f"edit-{comment_id}", data)

    @post("/issues/comments/{comment_id:int}/delete")
    async def delete_comment(
        self,
        forms: IssueFormsDep,
        actor: ActorDep,
        comment_id: FromPath[int],
        data: URLEncodedBody[WebForm],
    ) -> Template | Redirect:
        ipage = await forms.load()
        view = ipage.view
        _, issue = await ipage.comments.find(view.res, comment_id)

        async def act() -> str:
            await ipage.comments.delete(actor, view.res, comment_id)
            return "#timeline"

        return await ipage.answer(act(), issue.number, f"edit-{comment_id}", data)


class CommentBodyForm(msgspec.Struct, kw_only=True):
    body: Annotated[str, msgspec.Meta(min_length=1, max_length=65_536)]


def _sidebar_change(data: SidebarForm) -> dict[str, Any]:
    if data.sidebar == "labels":
        names = [data.labels] if isinstance(data.labels, str) else data.labels
        return {"labels": [n for n in names if n.strip()]}
    if data.sidebar == "assignees":
        return {"assignees": [a for a in data.assignees.replace(",", " ").split() if a]}
    if data.sidebar == "milestone":
        return {"milestone": int(data.milestone) if data.milestone.isdigit() else 0}
    return {}


def _from_pull(details: dict[str, Any]) -> bool:
    source = details.get("source")
    return isinstance(source, dict) and source.get("type") == "pull_request"


class IssuePage:
    """An issue's page for the caller: the issue, its timeline rendered, the sidebar's choices."""

    def __init__(self, view: RepoView, issues: Issues, comments: IssueComments, labels: Labels) -> None:
        self.view, self.issues, self.comments, self.labels = view, issues, comments, labels

    async def render(
        self,
        number: int,
        *,
        status_code: int = 200,
        form: str = "",
        typed: Any = None,
        errors: FormErrors = NO_ERRORS,
    ) -> Template:
        view, res = self.view, self.view.res
        issue = await self.issues.get(res, number)
        read = await self.issues.read(res, issue)
        timeline = await self.comments.timeline(res, issue, view.principal)
        html = {"body": md(view, read.body)} | {
            f"c{t.comment.id}": md(view, t.comment.body) for t in timeline if t.comment is not None
        }
        me = view.principal.account_id
        return view.render(
            "repos/issue.html", status_code, tab="issues", issue=read, timeline=timeline, html=html,
            can_comment=can(view.principal, Action.ISSUE_WRITE, res),
            can_answer=can(view.principal, Action.TASK_WRITE, res),  # a task's question, answered here
            can_triage=can(view.principal, Action.ISSUE_TRIAGE, res),
            can_admin_repo=can(view.principal, Action.REPO_ADMIN, res),
            is_author=me is not None and issue.author_id == me, my_login=view.principal.login if me else "",
            all_labels=await self.labels.all(res), milestones=await self.labels.milestones(res, "open"),
            pulls=[t for t in timeline if t.event == "cross-referenced" and _from_pull(t.details)],
            task_states={t.details.get("number"): t for t in timeline if t.event == "task_state"},
            form=form, typed=typed, errors=errors, ago=ago, exact=exact,
        )  # fmt: skip

    async def update(
        self, actor: Actor, number: str, change: Callable[[], dict[str, Any]], anchor: str, which: str, data: Any
    ) -> Template | Redirect:
        """The change one of the page's forms asks of the issue (`change()`, read as `IssueUpdate`),
        then the page at `anchor`; refused, the form `which` again with what was typed."""
        n = parse_number(number)

        async def act() -> str:
            await self.issues.update(actor, self.view.res, n, _spec(change(), IssueUpdate))
            return anchor

        return await self.answer(act(), n, which, data)

    async def answer(self, action: Awaitable[str], number: int, which: str, data: Any) -> Template | Redirect:
        """Act, then back to the issue's page (at the anchor the action names); refused, the page
        again with the form as typed and the reason beside its field."""

        async def again(exc: ForgeError) -> Template:
            session = self.issues.session
            await session.rollback()  # what the refused change flushed goes; the page reads what stands
            # A rollback expires what the session loaded: the repository is read again now, not
            # lazily while the page renders (no I/O there).
            await session.refresh(self.view.res.repo)
            await session.refresh(self.view.res.repo.owner)
            errors = form_errors(exc, ("title", "body", "labels", "assignees", "milestone", "state_reason"))
            return await self.render(number, status_code=exc.status, form=which, typed=data, errors=errors)

        anchor = await or_form_error(action, again)
        if isinstance(anchor, Template):
            return anchor
        return Redirect(f"/{self.view.res.full_name}/issues/{number}{anchor}", status_code=303)
