"""The review page of a task: the diff under review with inline comment forms, the agent's
summary, the reviews so far (markdown, sanitised), the merge rules' verdict and the merge form.
Same actions as the REST API; forms work without JavaScript.

Once the task has its pull request, the page answers with a redirect to the pull request's Files
changed tab, which shows and takes the same (forge/http/pages/pull_page.py through `TaskWork`): a
fragment of an old link is kept by the browser, and `?path=&line=&side=` becomes the fragment of
that file or line there. The forms still act when posted, then go to the pull request."""

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any

import msgspec
from litestar import Controller, Request, get, post
from litestar.params import FromPath, QueryParameter, URLEncodedBody
from litestar.response import Redirect, Template

from forge.core.errors import ForgeError
from forge.http.pages.common import page
from forge.http.pages.forms import NO_ERRORS, form_errors
from forge.http.pages.pull_page import line_anchor
from forge.http.pages.render import markdown_async
from tasks.core.schemas import ReviewDraftRead, ReviewRead
from tasks.core.states import ReviewVerdict
from tasks.http.actions import add_draft_comment, merge_task, remove_draft_comment, submit_review
from tasks.http.deps import REPO_TASKS, TaskScope, TaskScopeDep
from tasks.http.pages.common import PAGE_DEPENDENCIES, or_form_error, repo_context
from tasks.http.pages.forms import MergeForm, ReviewForm, draft_comment, merge_create, review_create
from tasks.services import rules
from tasks.services.review_drafts import DraftService
from tasks.services.reviews import VERBS, ReviewService

VERDICTS = {verdict.value: text for verdict, text in VERBS.items()}
PathQuery = Annotated[str | None, QueryParameter(name="path", max_length=4096)]
LineQuery = Annotated[int | None, QueryParameter(name="line", ge=1)]
SideQuery = Annotated[str | None, QueryParameter(name="side", max_length=8)]


def pull_page(scope: TaskScope, anchor: str = "") -> str | None:
    """Where the task's review now lives: its pull request's Files changed tab (None: it has no
    pull request yet, no changes or not opened, so the review page stays)."""
    number = scope.task.result_pull_number
    if number is None:
        return None
    return f"/{scope.owner}/{scope.name}/pull/{number}/files{anchor}"


def _after(scope: TaskScope, on_pull: str, here: str) -> Redirect:
    """Where a form of the review page goes once done: the pull request's page (at `on_pull`), or
    this page again (at `here`) while the task has none."""
    number = scope.task.result_pull_number
    base = f"/{scope.owner}/{scope.name}"
    where = f"{base}/pull/{number}{on_pull}" if number is not None else f"{base}/tasks/{scope.number}/review{here}"
    return Redirect(where, status_code=303)


@dataclass(frozen=True)
class PageForm:
    """One form of the review page: the inputs it shows and the refusals (codes or wire names) that
    concern each; `what` heads its refusal ("Not merged: ...")."""

    inputs: tuple[str, ...]
    aliases: Mapping[str, str]
    what: str


PAGE_FORMS = {
    "review": PageForm(
        ("review-body", "review-verdict"),
        {"review_empty": "review-body", "invalid_characters": "review-body", "policy_denied": "review-body"},
        "Not submitted",
    ),
    # The per-line form: a comment now, or onto the pending review.
    "comment": PageForm(
        ("inline-comment",),
        {
            "comment_empty": "inline-comment",
            "review_empty": "inline-comment",
            "invalid_characters": "inline-comment",
            "body": "inline-comment",
        },
        "Not added",
    ),
    "merge": PageForm((), {}, "Not merged"),
    "pending": PageForm((), {}, "Not removed"),
}


async def review_page(
    request: Request[Any, Any, Any], scope: TaskScope, *, status_code: int = 200, **refused: Any
) -> Template:
    """The page as it is now (after a failed form: read again, in a fresh session). `refused`: the
    refused form's name (`refused_form`), what was sent (`typed`) and its `errors`."""
    async with scope.system.db.session() as s:
        res, svc, task = await scope.reload(s)
        reviews = ReviewService(svc)
        comparison = None
        diff_error = None
        principal = scope.actor.principal
        contents = rules.may_read_contents(principal, res)
        if not contents:
            diff_error = "reading the diff needs the repo:read scope"
        elif task.head_sha:
            try:
                comparison = await reviews.comparison(res, task)
            except ForgeError as exc:
                diff_error = exc.detail
        listed = await reviews.reviews(task, quoted=contents)
        bodies = {r.id: await markdown_async(r.body) for r in listed if r.body}
        may_review = rules.may_review(principal, res, task)
        draft = await DraftService(reviews).read(scope.actor, res, task) if may_review else None
        pending = draft.comments if draft is not None else []
        # Inline comments are markdown too (sanitised), published and pending alike.
        comment_html = {
            c.id: await markdown_async(c.body) for c in [*pending, *(c for r in listed for c in r.comments)]
        }
        # Current-head comments under their lines: (path, side, line) -> comments.
        inline: dict[tuple[str, str, int], list[Any]] = {}
        for r in listed:
            for c in r.comments:
                if not c.outdated:
                    inline.setdefault((c.path, c.side, c.line), []).append((r.author, c, False))
        for c in pending:
            inline.setdefault((c.path, c.side, c.line), []).append((principal.login, c, True))
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
            can_review=may_review,
            pending=pending,
            comment_html=comment_html,
            **repo_context(res, principal, svc.base_url),
            **{"refused_form": "", "typed": {}, "errors": NO_ERRORS, "refused_what": "", **refused},
        )


class ReviewPages(Controller):
    path = REPO_TASKS
    include_in_schema = False
    dependencies = PAGE_DEPENDENCIES

    @staticmethod
    def again(
        request: Request[Any, Any, Any], scope: TaskScope, which: str, form: msgspec.Struct | None = None
    ) -> Callable[[ForgeError], Awaitable[Template]]:
        """The page again after `which` form was refused: `form` as it was sent, the refusal beside
        the field it concerns."""
        shown = PAGE_FORMS[which]

        async def render(exc: ForgeError) -> Template:
            errors = form_errors(exc, shown.inputs, shown.aliases)
            typed = form
            if isinstance(form, ReviewForm) and exc.code == "stale_commit":
                # The head moved: the text stays, a verdict is given again on the new changes.
                typed = msgspec.structs.replace(form, verdict=ReviewVerdict.COMMENT.value)
            return await review_page(
                request,
                scope,
                status_code=exc.status,
                refused_form=which,
                typed={which: typed} if typed is not None else {},
                errors=errors,
                refused_what=shown.what,
            )

        return render

    @get("/{number:str}/review")
    async def review(
        self, request: Request[Any, Any, Any], task_scope: TaskScopeDep,
        path: PathQuery = None, line: LineQuery = None, side: SideQuery = None,
    ) -> Template | Redirect:  # fmt: skip
        # No fragment of ours when none is asked for: the browser keeps the old link's own.
        anchor = "#" + line_anchor(path, line, "LEFT" if side in ("base", "LEFT") else "RIGHT") if path else ""
        moved = pull_page(task_scope, anchor)
        if moved is not None:
            return Redirect(moved, status_code=303)
        return await review_page(request, task_scope)

    @post("/{number:str}/reviews")
    async def submit(
        self, request: Request[Any, Any, Any], task_scope: TaskScopeDep, data: URLEncodedBody[ReviewForm]
    ) -> Template | Redirect:
        base = f"/{task_scope.owner}/{task_scope.name}/tasks/{task_scope.number}"
        if data.mode == "draft":

            async def add() -> ReviewDraftRead:
                return await add_draft_comment(task_scope, draft_comment(data))

            added = await or_form_error(add(), self.again(request, task_scope, "comment", data))
            if isinstance(added, Template):
                return added
            return _after(task_scope, "#pending-review", "#pending-comments")

        async def submit() -> ReviewRead:
            return await submit_review(task_scope, review_create(data))

        which = "comment" if data.path else "review"
        read = await or_form_error(submit(), self.again(request, task_scope, which, data))
        if isinstance(read, Template):
            return read
        # A change request starts a run: follow it on the task page.
        if read.run is not None:
            return Redirect(base, status_code=303)
        return _after(task_scope, "#conversation", "#reviews")

    @post("/{number:str}/review-draft/comments/{comment_id:int}/delete")
    async def remove_pending(
        self, request: Request[Any, Any, Any], task_scope: TaskScopeDep, comment_id: FromPath[int]
    ) -> Template | Redirect:
        done = await or_form_error(
            remove_draft_comment(task_scope, comment_id), self.again(request, task_scope, "pending")
        )
        if isinstance(done, Template):
            return done
        return _after(task_scope, "#pending-review", "#pending-comments")

    @post("/{number:str}/merge")
    async def merge(
        self, request: Request[Any, Any, Any], task_scope: TaskScopeDep, data: URLEncodedBody[MergeForm]
    ) -> Template | Redirect:
        merged = await or_form_error(
            merge_task(task_scope, merge_create(data)), self.again(request, task_scope, "merge", data)
        )
        if isinstance(merged, Template):
            return merged
        return _after(task_scope, "", "")
