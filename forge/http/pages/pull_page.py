"""A pull request's page, as read or with a refused form shown again: the description, the merge
box, the conversation (reviews and comments, threads on lines), the changes with a comment form
on every line, the review form and the person's own pending review (forge/http/pages/pulls.py
routes to it)."""

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from litestar.response import Template
from markupsafe import Markup

from forge.core.access import Action, can
from forge.core.errors import ForgeError
from forge.db.audit import Actor
from forge.http.pages.browse_render import ago, exact
from forge.http.pages.common import WebForm
from forge.http.pages.forms import NO_ERRORS, FormErrors, form_errors
from forge.http.pages.render import markdown
from forge.http.pages.repos import RepoView
from forge.repos import merge_rules, statuses
from forge.repos.pull_reviews import PullReviews
from forge.repos.pull_tasks import TaskPullStatus, TaskWork, task_number_of
from forge.repos.pulls import Pulls

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
        task_status = None
        # Tasks are hidden below the write role: a reader sees the pull request without its task's side.
        task_side = can(self.view.principal, Action.TASK_READ, res)
        if task_number is not None and self.tasks is not None and pull.state == "open" and task_side:
            found_reviews, task_status = await self._task_side(task_number)
            shape.unmet_rules = task_status.blockers
            if task_status.blockers and shape.mergeable_state == "clean":
                shape.mergeable_state = "blocked"
        html = await _html(
            {"body": pull.body}
            | {f"r{r.id}": r.body for r in found_reviews if r.body.strip()}
            | {f"c{c.id}": c.body for c in comments}
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
                + [("comment", c.created_at, c) for c in comments if c.path is None],
                key=lambda item: item[1],
            ),
            line_comments=[c for c in comments if c.path is not None],
            by_line=by_line,
            html=html,
            cmp=diff,
            checks=checks,
            verdicts=VERDICTS,
            can_review=can(principal, Action.PULL_REVIEW, res),
            task_number=task_number,
            task_status=task_status,
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

    async def _task_side(self, task: int) -> tuple[list[Any], TaskPullStatus]:
        """A task's pull request: the task's reviews and what its merge rules say, read through the
        task (its own transactions)."""
        assert self.tasks is not None
        view = self.view
        owner, name = view.res.repo.owner.login, view.res.repo.name
        actor = Actor(principal=view.principal)
        return (
            await self.tasks.reviews(actor, owner, name, task),
            await self.tasks.status(actor, owner, name, task),
        )
