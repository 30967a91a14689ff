"""A pull request's page, as read or with a refused form shown again: the description, the merge
box, the conversation (reviews and comments, threads on lines), the changes with a comment form
on every line, the review form and the person's own pending review (forge/http/pages/pulls.py
routes to it). A task's pull request shows its task's side instead (`TaskWork.side`): the task's
reviews, its inline comments under their lines, the reader's pending review of the task, and
the task's merge rules."""

import asyncio
import hashlib
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from litestar.response import Template
from markupsafe import Markup

from forge.core.access import Action, can
from forge.core.errors import ForgeError
from forge.db.audit import Actor
from forge.git.schemas import Comparison
from forge.http.pages.browse_render import DiffView, Row, ago, exact, split_rows
from forge.http.pages.common import WebForm
from forge.http.pages.forms import NO_ERRORS, FormErrors, form_errors
from forge.http.pages.render import markdown
from forge.http.pages.repos import RepoView
from forge.repos import merge_rules, pull_history, statuses
from forge.repos.pull_reviews import PullReviews
from forge.repos.pull_shapes import PullCommentRead
from forge.repos.pull_tasks import TaskLineComment, TaskPullSide, TaskWork, task_number_of
from forge.repos.pulls import Pulls

PullTab = Literal["conversation", "commits", "files"]

VERDICTS = {"APPROVED": "approved", "CHANGES_REQUESTED": "requested changes", "COMMENTED": "commented",
            "DISMISSED": "approved (dismissed: the head moved)"}  # fmt: skip


def _sanitised(text: str) -> Markup:
    # The sanitiser of agent markdown: scripts go, images of other origins go.
    return markdown(text, remote_images=False)


async def _html(texts: dict[str, str]) -> dict[str, Markup]:
    return await asyncio.to_thread(lambda: {k: _sanitised(v) for k, v in texts.items()})


def _threads(comments: list[Any]) -> dict[tuple[str, str, int], list[tuple[Any, list[Any]]]]:
    """(path, side, line) -> the threads on that line: each first comment with its replies."""
    replies: dict[int, list[Any]] = {}
    for c in comments:
        if c.in_reply_to_id is not None:
            replies.setdefault(c.in_reply_to_id, []).append(c)
    found: dict[tuple[str, str, int], list[tuple[Any, list[Any]]]] = {}
    for c in comments:
        if c.path is not None and c.line is not None and c.in_reply_to_id is None:
            found.setdefault((c.path, c.side or "RIGHT", c.line), []).append((c, replies.get(c.id, [])))
    return found


def file_anchor(path: str) -> str:
    """The id of a file's diff on the page (GitHub's: `diff-` and the path's SHA-256); its lines
    are `<id>R<n>` (the new version) and `<id>L<n>` (the old one)."""
    return "diff-" + hashlib.sha256(path.encode("utf-8", "surrogateescape")).hexdigest()


def line_anchor(path: str, line: int | None = None, side: str = "RIGHT") -> str:
    """The fragment of a file, or of one of its lines (`side` LEFT: the old version's number)."""
    return file_anchor(path) + ("" if line is None else f"{'L' if side == 'LEFT' else 'R'}{line}")


def _diff_context(diff: Comparison | None, view: DiffView) -> dict[str, Any]:
    """What the Files changed section needs of the diff: each file's anchor and, in the split
    view, its rows side by side (hunk headers included)."""
    files = diff.files if diff is not None else []
    split: dict[str, list[Row]] = {}
    if view == "split":
        for f in files:
            split[f.path] = [row for h in f.hunks for row in [Row(header=h.header), *split_rows(h.lines)]]
    return {"anchors": {f.path: file_anchor(f.path) for f in files}, "diff_view": view, "split": split}


def _under_lines(comments: list[TaskLineComment]) -> dict[tuple[str, str, int], list[TaskLineComment]]:
    """A task's inline comments under the lines of the current diff: the published ones on the
    current head, and the reader's pending ones."""
    found: dict[tuple[str, str, int], list[TaskLineComment]] = {}
    for t in comments:
        c = t.comment
        if c.path is not None and c.line is not None and (t.pending or not c.outdated):
            found.setdefault((c.path, c.side or "RIGHT", c.line), []).append(t)
    return found


class PullPage:
    """One pull request's page, as read or with a refused form shown again."""

    def __init__(self, view: RepoView, pulls: Pulls, tasks: TaskWork | None = None) -> None:
        self.view = view
        self.pulls = pulls
        self.tasks = tasks  # a task's pull request shows the task's reviews and merge rules

    def again(
        self, number: int, form: str, typed: WebForm, inputs: tuple[str, ...], *, rollback: bool = True
    ) -> Callable[[ForgeError], Awaitable[Template]]:
        """The page again with `form` refused: as it was sent, the refusal beside the input it concerns."""

        async def refused(exc: ForgeError) -> Template:
            if rollback:  # what the refused change flushed goes; the page reads what stands
                session = self.pulls.session
                await session.rollback()
                # A rollback expires what the session loaded: the repository is read again here,
                # not lazily while the page renders (no I/O there).
                await session.refresh(self.view.res.repo)
                await session.refresh(self.view.res.repo.owner)
            errors = form_errors(exc, inputs)
            return await self.render(number, status_code=exc.status, form=form, errors=errors, typed=typed)

        return refused

    async def render(
        self,
        number: int,
        *,
        status_code: int = 200,
        form: str = "",
        errors: FormErrors = NO_ERRORS,
        typed: WebForm | None = None,
        tab: PullTab = "conversation",
        diff_view: DiffView = "unified",
    ) -> Template:
        res, pulls = self.view.res, self.pulls
        pull = await pulls.get(res, number)
        reviews = PullReviews(pulls)
        diff = await reviews.diff(res, pull) if pull.head_sha or pull.state != "open" else None
        shape = await pulls.read(res, pull, diff if pull.state == "open" else None)
        viewer = self.view.principal.account_id
        task_number = task_number_of(pull.head_ref)  # a task's work: reviewed and merged as the task
        found_reviews = await reviews.reviews(res, pull, viewer)
        comments = await reviews.comments(res, pull, viewer=viewer)
        line_comments: list[PullCommentRead] = [c for c in comments if c.path is not None]
        side = await self._task_side(task_number)
        if side is not None:  # the task's reviews and inline comments, its merge rules while open
            found_reviews, line_comments = side.reviews, [t.comment for t in side.comments]
            if pull.state == "open":
                shape.unmet_rules = side.status.blockers
                if side.status.blockers and shape.mergeable_state == "clean":
                    shape.mergeable_state = "blocked"
        html = await _html(
            {"body": pull.body}
            | {f"r{r.id}": r.body for r in found_reviews if r.body.strip()}
            | {f"c{c.id}": c.body for c in comments}
            | ({f"t{t.comment.id}": t.comment.body for t in side.comments} if side is not None else {})
        )
        by_line = _threads(comments)
        checks = (
            await statuses.combined_status(
                pulls.session, res, pull.head_sha, f"{self.view.base_url}/api/v1/repos/{res.full_name}"
            )
            if pull.head_sha
            else None
        )
        principal = self.view.principal
        rules = await merge_rules.base_rules(pulls.session, res, pull.base_ref)
        return self.view.render(
            "repos/pull.html",
            status_code,
            tab="pulls",
            pull=shape,
            reviews=found_reviews,
            pending=next((r for r in found_reviews if r.state == "PENDING"), None),
            timeline=sorted(
                [("review", r.submitted_at, r) for r in found_reviews if r.state != "PENDING"]
                + [("comment", c.created_at, c) for c in comments if c.path is None]
                + [(h.kind, h.at, h) for h in await pull_history.history(pulls.session, pull)],
                key=lambda item: item[1],
            ),
            line_comments=line_comments,
            by_line=by_line,
            # a task's inline comments: under their lines, their quoted line, their html key ("t")
            task_by_line=_under_lines(side.comments) if side is not None else {},
            quoted={t.comment.id: t.quoted for t in side.comments} if side is not None else {},
            ckey="t" if side is not None else "c",
            runs=side.runs if side is not None else {},
            **_diff_context(diff, diff_view),
            files_tab=tab == "files",
            commits_tab=tab == "commits",
            html=html,
            cmp=diff,
            checks=checks,
            verdicts=VERDICTS,
            can_review=can(principal, Action.PULL_REVIEW, res),
            task_number=task_number,
            task_side=side is not None,
            task_status=side.status if side is not None else None,
            may_merge=merge_rules.may_merge(rules, principal.login or ""),
            mergers=rules.merge_allowlist,
            can_edit=can(principal, Action.PULL_WRITE, res),
            is_author=principal.account_id is not None and principal.login == (shape.user.login if shape.user else ""),
            form=form,
            errors=errors,
            typed=typed,
            ago=ago,
            exact=exact,
        )

    async def _task_side(self, task: int | None) -> TaskPullSide | None:
        """A task's pull request: the task's side, read through the task (its own transactions).
        Tasks are hidden below the write role: a reader sees the pull request without it."""
        view = self.view
        if task is None or self.tasks is None or not can(view.principal, Action.TASK_READ, view.res):
            return None
        owner, name = view.res.repo.owner.login, view.res.repo.name
        return await self.tasks.side(Actor(principal=view.principal), owner, name, task)
