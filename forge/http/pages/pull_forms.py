"""The forms of a pull request's page as the API's bodies (checked against the same schemas), and
the forms that may be a task's: a task's pull request is reviewed, commented on line by line and
merged through its task (`TaskWork`), whose service opens its own transactions, so these forms
hold no request transaction (`OwnForm`)."""

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec
from litestar import Request
from litestar.response import Redirect, Template

from forge.core.errors import ForgeError, InvalidInput
from forge.db.audit import Actor
from forge.db.models import PullComment, PullReview
from forge.http.pages.common import WebForm, or_form_error
from forge.http.pages.forms import invalid_input
from forge.http.pages.pull_page import PullPage
from forge.http.pages.repos import RepoView
from forge.repos import repositories
from forge.repos.pull_merge import MergeRunner
from forge.repos.pull_reviews import PullReviews
from forge.repos.pull_shapes import PendingReviewSubmit, PullCommentCreate, PullReviewCreate
from forge.repos.pull_tasks import TaskWork, task_number_of
from forge.repos.pulls import Pulls
from forge.repos.repositories import RepoResource

_S = TypeVar("_S")
_T = TypeVar("_T")


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


class MergeForm(WebForm):
    strategy: str = "merge"
    sha: str = ""


class StateForm(WebForm):
    state: str = ""  # closed | open | ready
    expected_head_sha: str = ""


def spec(raw: dict[str, Any], shape: type[_S]) -> _S:
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


def review_spec(data: ReviewForm) -> PullReviewCreate:
    if data.event not in ("APPROVE", "REQUEST_CHANGES", "COMMENT"):
        raise InvalidInput("choose Comment, Approve or Request changes", field="event")
    return spec({"event": data.event, "body": data.body, "commit_id": data.commit_id or None}, PullReviewCreate)


def line_comment(data: CommentForm) -> PullReviewCreate | None:
    """The comment form on a line as a review: into the pending review (`mode` review: no event) or
    a comment review of its own; None for a comment on the conversation or a reply."""
    if not data.path or data.in_reply_to:
        return None
    line = _number(data.line, "body")
    if line is None:
        raise InvalidInput("a line comment names its line", field="body")
    if not data.body.strip():
        raise InvalidInput("write a comment first", field="body")
    one = {
        "path": data.path,
        "line": line,
        "side": "LEFT" if data.side == "LEFT" else "RIGHT",
        "body": data.body.strip(),
    }
    return spec({"event": None if data.mode == "review" else "COMMENT", "comments": [one]}, PullReviewCreate)


async def person_review(reviews: PullReviews, actor: Actor, res: RepoResource, n: int, data: ReviewForm) -> PullReview:
    """A person's pull request reviewed from the page: their pending review published with the
    verdict, or a review of its own."""
    pending = await reviews.pending_of(await reviews.pulls.get(res, n), actor.principal.account_id)
    if pending is not None:
        publish = spec({"event": data.event, "body": data.body}, PendingReviewSubmit)
        return await reviews.publish_pending(actor, res, n, pending.id, publish)
    return await reviews.submit(actor, res, n, review_spec(data))


async def person_comment(
    reviews: PullReviews, actor: Actor, res: RepoResource, n: int, data: CommentForm
) -> PullComment | PullReview:
    """The comment form: a line comment (now, or into the pending review), a conversation comment
    or a reply."""
    on_line = line_comment(data)
    if on_line is not None and on_line.event is None:  # gathered in the author's pending review
        return await reviews.submit(actor, res, n, on_line)
    reply_to = _number(data.in_reply_to, "body")
    if not data.body.strip():
        raise InvalidInput("write a comment first", field="body")
    raw = {"body": data.body.strip(), "path": None, "line": None, "in_reply_to": reply_to}
    if on_line is not None:
        [one] = on_line.comments
        raw |= {"path": one.path, "line": one.line, "side": one.side}
    return await reviews.comment(actor, res, n, spec(raw, PullCommentCreate))


@dataclass
class OwnForm:
    """A form of a pull request's page that may be its task's: whether it is, the person's side in
    a write transaction of its own, and the page again (read afresh) when it is refused."""

    request: Request[Any, Any, Any]
    actor: Actor
    runner: MergeRunner
    tasks: TaskWork | None
    owner: str
    name: str
    number: int

    def pulls(self, session: Any) -> Pulls:
        agents = self.request.app.state.get("agent_work")  # a bot mentioned in a comment starts work
        return Pulls(session, self.runner.store, self.runner.bus, self.runner.base_url, agents)

    async def task(self) -> int | None:
        """The task whose work the pull request holds, when tasks are composed in."""
        if self.tasks is None:
            return None
        async with self.runner.db.session() as s:
            res = await repositories.load(s, self.actor.principal, self.owner, self.name)
            return task_number_of((await self.pulls(s).get(res, self.number)).head_ref)

    async def as_person(self, act: Callable[[PullReviews, RepoResource], Awaitable[_T]]) -> _T:
        async with self.runner.db.session(write=True) as s:
            res = await repositories.load(s, self.actor.principal, self.owner, self.name)
            return await act(PullReviews(self.pulls(s)), res)

    def again(self, form: str, typed: WebForm, inputs: tuple[str, ...]) -> Callable[[ForgeError], Awaitable[Template]]:
        async def refused(exc: ForgeError) -> Template:
            async with self.runner.db.session() as s:
                res = await repositories.load(s, self.actor.principal, self.owner, self.name)
                view = RepoView(self.request, res, self.actor.principal, self.runner.base_url)
                page = PullPage(view, self.pulls(s), self.tasks)
                return await page.again(self.number, form, typed, inputs, rollback=False)(exc)

        return refused

    async def answer(
        self, act: Awaitable[str], form: str, typed: WebForm, inputs: tuple[str, ...]
    ) -> Template | Redirect:
        """`act` (which returns the anchor to show), then back to the page; refused, the page again
        with the form as typed and the reason beside its input."""
        anchor = await or_form_error(act, self.again(form, typed, inputs), raise_404=False)
        if isinstance(anchor, Template):
            return anchor
        return Redirect(f"/{self.owner}/{self.name}/pull/{self.number}{anchor}", status_code=303)
