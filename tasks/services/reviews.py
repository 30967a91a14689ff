"""Reviews of a task's branch: verdicts, inline comments, change requests, and the merge rules.

- A review is bound to the head commit it was written against; when the agent moves the head, the
  review and its inline comments read `outdated` (kept, not lost) and its approval stops counting.
- Inline comments anchor on a line of the diff under review (`base...head`): `side` head is a new
  line number of an added or unchanged line, `side` base an old one of a removed or unchanged line.
  A line outside the diff is refused.
- `request_changes` starts a follow-up `review` run on the same branch whose prompt is the body
  plus every inline comment on the current head not yet handed to the agent (file, line, the
  quoted code, the comment), passed through `user_prompt_submit` like any prompt.
- Merge rules (`repo_settings.merge_rules`): enough approvals of the current head (default 1),
  optionally not from the person who started the task; no reviewer whose latest verdict is
  `request_changes`. The task's own agent cannot review it.
- A review draft (verdict `pending`, one per reviewer and task, seen only by its author): inline
  comments gathered one by one (`tasks.services.review_drafts`) and published with the verdict
  of the reviewer's next review, all at once. Drafts count for nothing and reach nobody until then."""

from collections.abc import Sequence
from typing import Any

from sqlalchemy import select

from forge.core.access import Principal
from forge.core.errors import InvalidInput, InvalidState
from forge.core.text import require_no_nul, without_nul
from forge.db import audit
from forge.db.audit import Actor
from forge.db.engine import utcnow
from forge.db.models import Account, Repository
from forge.git import RefNotFound, compare
from forge.git.schemas import Comparison
from forge.repos import merge_rules as branch_rules
from forge.repos import statuses
from forge.repos.pulls import Pulls
from forge.repos.repositories import RepoResource, resource_for
from tasks.core import payloads, repo_settings, task_pulls
from tasks.core.lifecycle import PromptCheck
from tasks.core.models import Review, ReviewComment, Run, Task
from tasks.core.schemas import ReviewCommentCreate, ReviewCommentRead, ReviewCreate, ReviewRead, ReviewStatus
from tasks.core.states import ReviewVerdict, RunKind, TaskState
from tasks.core.transcript import Notice, Pending, Prompt
from tasks.services import rules
from tasks.services.reads import logins
from tasks.services.tasks import TaskService

# The verdict of a review draft (not a `ReviewVerdict`: nobody submits it; `submit` replaces it).
DRAFT = "pending"

VERBS = {
    ReviewVerdict.APPROVE: "approved",
    ReviewVerdict.REQUEST_CHANGES: "requested changes",
    ReviewVerdict.COMMENT: "commented",
}


def _anchors(comparison: Comparison) -> dict[str, dict[str, dict[int, str]]]:
    """path -> side -> line number -> the line's text: where inline comments may go."""
    out: dict[str, dict[str, dict[int, str]]] = {}
    for f in comparison.files:
        sides: dict[str, dict[int, str]] = {"base": {}, "head": {}}
        for hunk in f.hunks:
            for line in hunk.lines:
                if line.origin in ("+", " ") and line.new_lineno is not None:
                    sides["head"][line.new_lineno] = line.content
                if line.origin in ("-", " ") and line.old_lineno is not None:
                    sides["base"][line.old_lineno] = line.content
        out[f.path] = sides
        if f.old_path and f.old_path != f.path:
            out.setdefault(f.old_path, {"base": sides["base"], "head": {}})
    return out


def change_request_prompt(body: str, comments: Sequence[ReviewComment], reviewer: str) -> str:
    """The follow-up run's prompt: the review body, then each inline comment with its code."""
    parts = [f"{reviewer} reviewed your changes and requests changes."]
    if body.strip():
        parts.append(body.strip())
    for c in comments:
        where = f"{c.path}, line {c.line}" + (" (the old version)" if c.side == "base" else "")
        quoted = "\n".join("> " + q for q in c.quoted.rstrip("\n").split("\n"))
        parts.append(f"{where}:\n{quoted}\n{c.body.strip()}")
    parts.append("Make these changes on the task branch, then summarise what you changed.")
    return "\n\n".join(parts)


def comment_read(c: ReviewComment, task: Task, *, quoted: bool = True) -> ReviewCommentRead:
    return ReviewCommentRead(
        id=c.id,
        path=c.path,
        side=c.side,
        line=c.line,
        body=c.body,
        quoted=c.quoted if quoted else "",
        commit_sha=c.commit_sha,
        outdated=c.commit_sha != task.head_sha,
    )


class ReviewService:
    def __init__(self, tasks: TaskService) -> None:
        self.tasks = tasks
        self.session = tasks.session

    async def comparison(self, res: RepoResource, task: Task) -> Comparison:
        """The diff under review: `base...head` at the task's head commit."""
        if not task.head_sha:
            raise InvalidState("the task has no commit yet", code="no_head")
        # Once merged, the base holds the work: the diff stays the one from where the task started.
        base = task.base_sha if task.state == TaskState.MERGED and task.base_sha else task.base
        try:
            return await self.tasks.store.read(res.key, compare, base, task.head_sha)
        except RefNotFound:
            raise InvalidState(f"the base branch {task.base!r} is gone", code="base_not_found") from None

    async def reviews(self, task: Task, *, quoted: bool = True) -> list[ReviewRead]:
        """`quoted=False` blanks the lines comments quote (for a reader without `repo:read`:
        `rules.may_read_contents`)."""
        rows = (
            (
                await self.session.execute(
                    select(Review).where(Review.task_id == task.id, Review.verdict != DRAFT).order_by(Review.id)
                )
            )
            .scalars()
            .all()
        )
        comments = (
            (
                await self.session.execute(
                    select(ReviewComment).where(ReviewComment.task_id == task.id).order_by(ReviewComment.id)
                )
            )
            .scalars()
            .all()
        )
        by_review: dict[int, list[ReviewComment]] = {}
        for c in comments:
            by_review.setdefault(c.review_id, []).append(c)
        names = await logins(self.session, {r.author_id for r in rows if r.author_id})
        run_ids = {r.run_id for r in rows if r.run_id is not None}
        seqs = dict((await self.session.execute(select(Run.id, Run.seq).where(Run.id.in_(run_ids)))).tuples().all())
        out = []
        for r in rows:
            out.append(
                ReviewRead(
                    id=r.uuid,
                    verdict=r.verdict,
                    body=r.body,
                    author=names.get(r.author_id) if r.author_id else None,
                    commit_sha=r.commit_sha,
                    outdated=r.commit_sha != task.head_sha,
                    created_at=r.created_at,
                    run=seqs.get(r.run_id) if r.run_id is not None else None,
                    comments=[comment_read(c, task, quoted=quoted) for c in by_review.get(r.id, [])],
                )
            )
        return out

    async def status(self, task: Task) -> ReviewStatus:
        merge_rules = await repo_settings.merge_rules(self.session, task.repo_id)
        rows = (
            (await self.session.execute(select(Review).where(Review.task_id == task.id).order_by(Review.id)))
            .scalars()
            .all()
        )
        latest: dict[int, Review] = {}  # author -> latest approve / request_changes
        for r in rows:
            if r.verdict not in (ReviewVerdict.COMMENT, DRAFT) and r.author_id is not None:
                latest[r.author_id] = r
        approvers: list[str] = []
        asking: list[str] = []
        repo = await self.session.get(Repository, task.repo_id)
        for author_id, r in latest.items():
            author = await self.session.get(Account, author_id)
            if author is None or repo is None or not await _counts(self.session, author, repo):
                continue  # a reviewer who lost access (or was disabled) neither counts nor blocks
            login = author.login
            if r.verdict == ReviewVerdict.REQUEST_CHANGES:
                asking.append(login)
            elif r.commit_sha == task.head_sha and rules.approval_counts(
                author_id, task, not_by_starter=merge_rules.approval_not_by_starter
            ):
                approvers.append(login)
        blockers = []
        if task.state != TaskState.AWAITING_REVIEW:
            blockers.append(f"the task is {task.state}, not awaiting review")
        # The base branch's rules bind a task's merge as they bind any pull request's.
        res = RepoResource(repo=repo) if repo is not None else None
        base = await branch_rules.base_rules(self.session, res, task.base) if res is not None else None
        required = max(merge_rules.required_approvals, base.required_approvals if base else 0)
        if len(approvers) < required:
            who = (
                " from someone other than the person who started the task"
                if merge_rules.approval_not_by_starter
                else ""
            )
            blockers.append(f"{required} approval(s) of the current head needed{who}, {len(approvers)} given")
        if asking:
            blockers.append("changes requested by " + ", ".join(sorted(asking)))
        if task.head_sha and task.head_sha == task.base_sha:
            blockers.append("the task's runs changed nothing: there is nothing to merge")
        checks = None
        if repo is not None and task.head_sha:  # the head's statuses, and the base branch's required checks
            checks, unmet = await statuses.head_checks(self.session, repo, task.base, task.head_sha)
            blockers += unmet
        if res is not None and base is not None and base.require_code_owner_review and task.head_sha:
            blockers += await branch_rules.code_owners_unmet(
                self.session, res, self.tasks.store, task.base, task.head_sha, approvers
            )
        return ReviewStatus(
            head_sha=task.head_sha,
            approvals=sorted(approvers),
            required_approvals=required,
            approval_not_by_starter=merge_rules.approval_not_by_starter,
            change_requests=sorted(asking),
            blockers=blockers,
            checks=checks,
        )

    async def _prepare(
        self, actor: Actor, res: RepoResource, task: Task, data: ReviewCreate
    ) -> tuple[str, str, list[ReviewComment], list[ReviewComment], str | None]:
        """Check a review; returns the sha, the body, its new inline comments, the comments a
        change request hands to the agent (earlier unsent ones on this head, then the new ones)
        and that change request's prompt (None for other verdicts)."""
        rules.require_review(actor.principal, res, task)
        if task.state != TaskState.AWAITING_REVIEW:
            raise InvalidState(f"the task is {task.state}, not awaiting review", code="task_not_in_review")
        sha = data.commit_sha.strip().lower() or task.head_sha
        if sha != task.head_sha:
            raise InvalidState(
                f"the review is on {sha[:12]}, but the task's head is {task.head_sha[:12]}",
                code="stale_commit",
                head_sha=task.head_sha,
            )
        body = require_no_nul(data.body, "a review").strip()
        draft = await self.draft(actor.principal, task)
        drafted = bool(draft is not None and await self.draft_comments(draft))
        if data.verdict is not ReviewVerdict.APPROVE and not body and not data.comments and not drafted:
            raise InvalidInput("say something: a body or inline comments", code="review_empty")
        comments = await self.inline_comments(res, task, data.comments)
        if data.verdict is not ReviewVerdict.REQUEST_CHANGES:
            return sha, body, comments, [], None
        earlier = (
            (
                await self.session.execute(
                    select(ReviewComment)
                    .join(Review, Review.id == ReviewComment.review_id)
                    .where(
                        ReviewComment.task_id == task.id,
                        ReviewComment.commit_sha == sha,
                        ReviewComment.sent_run_id.is_(None),
                        # Published comments, and the reviewer's own draft (published now), never others' drafts.
                        (Review.verdict != DRAFT) | (Review.author_id == actor.principal.account_id),
                    )
                    .order_by(ReviewComment.id)
                )
            )
            .scalars()
            .all()
        )
        handed = [*earlier, *comments]
        return sha, body, comments, handed, change_request_prompt(body, handed, actor.principal.login)

    async def precheck(self, actor: Actor, res: RepoResource, task: Task, data: ReviewCreate) -> PromptCheck | None:
        """A change request's `user_prompt_submit`, asked before the write transaction."""
        *_, prompt = await self._prepare(actor, res, task, data)
        if prompt is None:
            return None
        return await self.tasks.precheck_prompt(await self.tasks.gate_ctx(task, res, actor), prompt, "review")

    async def submit(
        self, actor: Actor, res: RepoResource, task: Task, data: ReviewCreate, *, checked: PromptCheck | None = None
    ) -> Review:
        task = await self.tasks.life.lock(task)
        sha, body, comments, handed, prompt = await self._prepare(actor, res, task, data)
        review = await self.draft(actor.principal, task)
        drafted = await self.draft_comments(review) if review is not None else []
        if review is None:
            review = Review(task_id=task.id, repo_id=task.repo_id, author_id=actor.principal.account_id)
            self.session.add(review)
        # The draft, if any, becomes this review: its comments are published with the verdict.
        review.verdict, review.body, review.commit_sha, review.created_at = data.verdict, body, sha, utcnow()
        await self.session.flush()
        for c in comments:
            c.review_id = review.id
            c.commit_sha = sha
            self.session.add(c)
        await self.session.flush()
        login = actor.principal.login
        notes = [Pending(kind="notice", payload=Notice(text=f"{login} {VERBS[data.verdict]} ({sha[:12]})"))]
        run = None
        if prompt is not None:
            prompt = await self.tasks.life.check_prompt(
                await self.tasks.gate_ctx(task, res, actor), prompt, "review", checked
            )
            run = await self.tasks.life.enqueue(task, res.repo, RunKind.REVIEW, prompt, actor.principal)
            review.run_id = run.id
            for sent in handed:
                sent.sent_run_id = run.id
            notes.append(
                Pending(kind="prompt", payload=Prompt(text=prompt, source="review", author=login), run_id=run.id)
            )
        await self.tasks.life.append(task.id, notes)
        await self.tasks.life.publish(
            "review.submitted",
            task,
            res.repo,
            actor=actor.principal,
            run=run,
            data=payloads.review_submitted(review, [*drafted, *comments]),
        )
        pulls = Pulls(self.session, self.tasks.store, self.tasks.bus, self.tasks.base_url)
        await task_pulls.reviewed(pulls, actor, res, task, review.id, data.verdict.value, len(comments) + len(drafted))
        audit.record(
            self.session,
            actor,
            "task.review",
            f"{res.full_name}#{task.number}",
            verdict=data.verdict,
            commit_sha=sha,
            comments=len(comments) + len(drafted),
        )
        return review

    async def draft(self, principal: Principal, task: Task) -> Review | None:
        """The principal's review draft of the task, if it has one."""
        if principal.account_id is None:
            return None
        stmt = select(Review).where(
            Review.task_id == task.id, Review.author_id == principal.account_id, Review.verdict == DRAFT
        )
        return (await self.session.execute(stmt)).scalars().first()

    async def draft_comments(self, draft: Review) -> list[ReviewComment]:
        stmt = select(ReviewComment).where(ReviewComment.review_id == draft.id).order_by(ReviewComment.id)
        return list((await self.session.execute(stmt)).scalars().all())

    async def inline_comments(
        self, res: RepoResource, task: Task, given: Sequence[ReviewCommentCreate]
    ) -> list[ReviewComment]:
        """Inline comments checked against the diff under review (not added to the session)."""
        comments: list[ReviewComment] = []
        if not given:
            return comments
        anchors = _anchors(await self.comparison(res, task))
        for i, one in enumerate(given):
            path = require_no_nul(one.path, "a path")
            text = require_no_nul(one.body, "a comment").strip()
            if not text:
                raise InvalidInput(f"comment {i + 1} is empty", code="comment_empty")
            quoted = anchors.get(path, {}).get(one.side, {}).get(one.line)
            if quoted is None:
                raise InvalidInput(
                    f"comment {i + 1}: line {one.line} ({one.side}) of {path!r} is not in the diff",
                    code="comment_outside_diff",
                    index=i,
                )
            # The agent wrote the line; the database cannot store NUL.
            comments.append(
                ReviewComment(
                    task_id=task.id, path=path, side=one.side, line=one.line, body=text, quoted=without_nul(quoted)
                )
            )
        return comments


async def _counts(session: Any, account: Account, repo: Repository) -> bool:
    """Whether the account could review this repository's tasks now (its verdicts count)."""
    if account.disabled:
        return False
    principal = Principal(
        account_id=account.id,
        login=account.login,
        type="Bot" if account.is_bot else "User",
        is_admin=account.is_admin,
        via="session",
    )
    return rules.may_review(principal, await resource_for(session, repo, principal))
