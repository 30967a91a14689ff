"""Reviews, comments and review requests of pull requests (docs/pulls.md, "Reviews").

A review is a verdict at one head (`APPROVE`, `REQUEST_CHANGES`, `COMMENT`) with a body and any
number of line comments; a comment stands alone on the conversation or on a line of the diff.
Line comments must name a line the diff shows (`invalid_review_line` otherwise). A review names
the head it read (`commit_id`): an older one is refused with `head_moved`, so an approval never
covers commits its author has not seen. The author of a pull request may comment on it but not
approve it or request changes (`cannot_review_own`), as on GitHub. What the verdicts add up to
is `forge.repos.merge_rules`."""

from dataclasses import dataclass

from sqlalchemy import func, select

from forge.core.access import Action, Role, require
from forge.core.error_codes import Code
from forge.core.errors import InvalidInput, InvalidState, NotFound
from forge.db import audit
from forge.db.audit import Actor
from forge.db.engine import utcnow
from forge.db.events import AccountRef
from forge.db.models import Account, PullComment, PullRequest, PullReview, PullReviewRequest
from forge.git.compare import compare
from forge.git.schemas import Comparison
from forge.repos import pull_conversation, pull_review_agents
from forge.repos.pull_review_reads import PENDING, PullReviewReads
from forge.repos.pull_shapes import (
    PendingReviewSubmit,
    PullCommentCreate,
    PullReviewCommentCreate,
    PullReviewCreate,
)
from forge.repos.pull_tasks import refuse_task_pull
from forge.repos.repositories import RepoResource, resource_roles

_VERDICTS = {"APPROVE": "approve", "REQUEST_CHANGES": "request_changes", "COMMENT": "comment"}


def anchors(comparison: Comparison) -> dict[str, dict[str, set[int]]]:
    """path -> side (LEFT base, RIGHT head) -> the line numbers the diff shows on that side."""
    out: dict[str, dict[str, set[int]]] = {}
    for f in comparison.files:
        sides: dict[str, set[int]] = {"LEFT": set(), "RIGHT": set()}
        for hunk in f.hunks:
            for line in hunk.lines:
                if line.origin in ("+", " ") and line.new_lineno is not None:
                    sides["RIGHT"].add(line.new_lineno)
                if line.origin in ("-", " ") and line.old_lineno is not None:
                    sides["LEFT"].add(line.old_lineno)
        out[f.path] = sides
        if f.old_path and f.old_path != f.path:
            out.setdefault(f.old_path, {"LEFT": sides["LEFT"], "RIGHT": set()})
    return out


@dataclass
class PullReviews(PullReviewReads):
    async def diff(self, res: RepoResource, pull: PullRequest) -> Comparison:
        """What the pull request changes now: its head against the merge base with its base."""
        base = pull.base_ref if pull.state == "open" else pull.base_sha
        head = pull.head_sha or pull.head_ref
        return await self.pulls.store.read(res.key, compare, base, head)

    async def _check_lines(self, res: RepoResource, pull: PullRequest, wanted: list[PullReviewCommentCreate]) -> None:
        if not wanted:
            return
        shown = anchors(await self.diff(res, pull))
        for c in wanted:
            if c.line not in shown.get(c.path, {}).get(c.side, set()):
                raise InvalidInput(
                    f"line {c.line} of {c.path[:200]} ({c.side}) is not in the diff: comment on a line the "
                    "Files tab shows",
                    code=Code.INVALID_REVIEW_LINE,
                    path=c.path[:200],
                    line=c.line,
                )

    async def submit(self, actor: Actor, res: RepoResource, number: int, data: PullReviewCreate) -> PullReview:
        require(actor.principal, Action.PULL_REVIEW, res)
        pull = await self.pulls.get(res, number, lock=True)
        refuse_task_pull(res, pull, self.pulls.base_url)
        if data.event is None:
            return await self._add_pending(actor, res, pull, data)
        verdict = _VERDICTS[data.event]
        self._check_review(actor, pull, verdict, data)
        await self._check_lines(res, pull, data.comments)
        review = PullReview(
            pull_id=pull.id,
            author_id=actor.principal.account_id,
            verdict=verdict,
            body=data.body,
            commit_sha=pull.head_sha,
        )
        self.session.add(review)
        await self.session.flush()
        for c in data.comments:
            self.session.add(self._comment(actor, pull, c.body, c.path, c.line, c.side, review.id))
        await self._answered(actor, res, pull, review, len(data.comments))
        return review

    async def _answered(
        self, actor: Actor, res: RepoResource, pull: PullRequest, review: PullReview, comments: int
    ) -> None:
        """A review published: the reviewer's request answered, the audit row, `pull_request.review_submitted`."""
        audit.record(
            self.session,
            actor,
            "repo.pull.review",
            f"{res.full_name}#{pull.number}",
            verdict=review.verdict,
            head_sha=pull.head_sha,
            comments=comments,
        )
        await self.pulls.record_review(actor, res, pull, review.id, review.verdict, comments)

    async def pending_of(self, pull: PullRequest, author_id: int | None) -> PullReview | None:
        """The author's pending review of the pull request, if they have one."""
        found = await self.session.execute(
            select(PullReview).where(
                PullReview.pull_id == pull.id, PullReview.author_id == author_id, PullReview.verdict == PENDING
            )
        )
        return found.scalar_one_or_none()

    async def _add_pending(
        self, actor: Actor, res: RepoResource, pull: PullRequest, data: PullReviewCreate
    ) -> PullReview:
        """Comments gathered in the author's pending review (one per person), seen by them only."""
        if pull.state != "open":
            raise InvalidState(f"#{pull.number} is {pull.state}: only comments are taken now", code=Code.PULL_NOT_OPEN)
        await self._check_lines(res, pull, data.comments)
        review = await self.pending_of(pull, actor.principal.account_id)
        if review is None:
            review = PullReview(
                pull_id=pull.id,
                author_id=actor.principal.account_id,
                verdict=PENDING,
                body="",
                commit_sha=pull.head_sha,
            )
            self.session.add(review)
            await self.session.flush()
        if data.body.strip():
            review.body = data.body
        for c in data.comments:
            self.session.add(self._comment(actor, pull, c.body, c.path, c.line, c.side, review.id))
        audit.record(
            self.session,
            actor,
            "repo.pull.review_pending",
            f"{res.full_name}#{pull.number}",
            comments=len(data.comments),
        )
        await self.session.flush()
        return review

    async def publish_pending(
        self, actor: Actor, res: RepoResource, number: int, review_id: int, data: PendingReviewSubmit
    ) -> PullReview:
        """Publish the caller's pending review with a verdict: as a review written now, at the head."""
        require(actor.principal, Action.PULL_REVIEW, res)
        pull = await self.pulls.get(res, number, lock=True)
        review = await self.pending_of(pull, actor.principal.account_id)
        if review is None or review.id != review_id:
            raise NotFound(f"you have no pending review {review_id} on #{number}", code=Code.NOT_FOUND)
        verdict = _VERDICTS[data.event]
        comments = (
            await self.session.execute(select(func.count(PullComment.id)).where(PullComment.review_id == review.id))
        ).scalar_one()
        body = data.body or review.body
        self._check_review(actor, pull, verdict, PullReviewCreate(event=data.event, body=body, comments=[]), comments)
        review.verdict, review.body, review.commit_sha, review.created_at = verdict, body, pull.head_sha, utcnow()
        await self._answered(actor, res, pull, review, int(comments))
        return review

    async def dismiss(self, actor: Actor, res: RepoResource, number: int, review_id: int, message: str) -> PullReview:
        """A repository admin dismisses a published approval or change request (GitHub's dismissal):
        it no longer counts nor blocks; the message says why (audited)."""
        require(actor.principal, Action.REPO_ADMIN, res)
        pull = await self.pulls.get(res, number, lock=True)
        review = await self.session.get(PullReview, review_id)
        if review is None or review.pull_id != pull.id or review.verdict not in ("approve", "request_changes"):
            raise NotFound(f"#{number} has no approval or change request {review_id}", code=Code.NOT_FOUND)
        if not message.strip():
            raise InvalidInput("say why the review is dismissed", code=Code.VALIDATION_FAILED, field="message")
        review.dismissed = True
        audit.record(
            self.session, actor, "repo.pull.dismiss_review", f"{res.full_name}#{number}", review=review_id,
            message=message.strip()[:1000],
        )  # fmt: skip
        await self.session.flush()
        return review

    async def discard_pending(self, actor: Actor, res: RepoResource, number: int, review_id: int) -> None:
        require(actor.principal, Action.PULL_REVIEW, res)
        pull = await self.pulls.get(res, number)
        review = await self.pending_of(pull, actor.principal.account_id)
        if review is None or review.id != review_id:
            raise NotFound(f"you have no pending review {review_id} on #{number}", code=Code.NOT_FOUND)
        audit.record(
            self.session, actor, "repo.pull.review_discard", f"{res.full_name}#{pull.number}", review=review_id
        )
        await self.session.delete(review)
        await self.session.flush()

    @staticmethod
    def _check_review(actor: Actor, pull: PullRequest, verdict: str, data: PullReviewCreate, gathered: int = 0) -> None:
        if verdict != "comment" and pull.state != "open":
            raise InvalidState(f"#{pull.number} is {pull.state}: only comments are taken now", code=Code.PULL_NOT_OPEN)
        if verdict != "comment" and actor.principal.account_id == pull.author_id:
            raise InvalidInput(
                "the author of a pull request cannot approve it or request changes: comment instead",
                code=Code.CANNOT_REVIEW_OWN,
            )
        if verdict != "approve" and not data.body.strip() and not data.comments and not gathered:
            raise InvalidInput(
                "a review that requests changes or comments needs a body or line comments: say what to change",
                code=Code.VALIDATION_FAILED,
                field="body",
            )
        given = (data.commit_id or "").strip().lower()
        if given and given != pull.head_sha:
            raise InvalidState(
                f"the head is {pull.head_sha[:12] or 'gone'}, not {given[:12]}: read the new commits, then review",
                code=Code.HEAD_MOVED,
                head_sha=pull.head_sha,
            )

    @staticmethod
    def _comment(
        actor: Actor,
        pull: PullRequest,
        body: str,
        path: str | None,
        line: int | None,
        side: str | None,
        review_id: int | None = None,
    ) -> PullComment:
        return PullComment(
            pull_id=pull.id,
            review_id=review_id,
            author_id=actor.principal.account_id,
            body=body,
            path=path,
            line=line,
            side=side if path else None,
            commit_sha=pull.head_sha,
        )

    async def comment(self, actor: Actor, res: RepoResource, number: int, data: PullCommentCreate) -> PullComment:
        """A comment on the conversation, or on a line of the diff (`path` and `line`)."""
        require(actor.principal, Action.PULL_REVIEW, res)
        pull = await self.pulls.get(res, number)
        if data.in_reply_to is not None:
            root = await self._thread(pull, data.in_reply_to)
            row = self._comment(actor, pull, data.body, root.path, root.line, root.side)
            row.in_reply_to_id = root.id
        else:
            if (data.path is None) != (data.line is None):
                raise InvalidInput("a line comment names both path and line", code=Code.VALIDATION_FAILED)
            if data.path is not None and data.line is not None:
                await self._check_lines(
                    res, pull, [PullReviewCommentCreate(path=data.path, line=data.line, body=data.body, side=data.side)]
                )
            row = self._comment(actor, pull, data.body, data.path, data.line, data.side)
        self.session.add(row)
        await self.session.flush()
        audit.record(
            self.session, actor, "repo.pull.comment", f"{res.full_name}#{pull.number}", comment=row.id, path=data.path
        )
        if data.path is None and data.in_reply_to is None:  # on the conversation
            await pull_conversation.after_comment(self.pulls, actor, res, pull, row)
        return row

    async def _thread(self, pull: PullRequest, comment_id: int) -> PullComment:
        """The first comment of the line thread `comment_id` belongs to (404 when there is none)."""
        found = await self.session.get(PullComment, comment_id)
        if found is not None and found.in_reply_to_id is not None:
            found = await self.session.get(PullComment, found.in_reply_to_id)
        if found is None or found.pull_id != pull.id or found.path is None:
            raise NotFound(f"#{pull.number} has no line comment {comment_id}", code=Code.NOT_FOUND)
        return found

    async def resolve(
        self, actor: Actor, res: RepoResource, number: int, comment_id: int, *, resolved: bool
    ) -> PullComment:
        """Mark the thread of a line comment resolved, or open it again."""
        require(actor.principal, Action.PULL_REVIEW, res)
        root = await self._thread(await self.pulls.get(res, number), comment_id)
        root.resolved_at = utcnow() if resolved else None
        root.resolved_by_id = actor.principal.account_id if resolved else None
        action = "repo.pull.resolve_thread" if resolved else "repo.pull.unresolve_thread"
        audit.record(self.session, actor, action, f"{res.full_name}#{number}", comment=root.id)
        await self.session.flush()
        return root

    async def request(self, actor: Actor, res: RepoResource, number: int, logins: list[str]) -> PullRequest:
        """Ask people or bots with write access to review (again, if they have)."""
        require(actor.principal, Action.PULL_WRITE, res)
        pull = await self.pulls.get(res, number)
        accounts = await self._reviewers(res, pull, logins)
        have = set(
            (
                await self.session.execute(
                    select(PullReviewRequest.account_id).where(PullReviewRequest.pull_id == pull.id)
                )
            ).scalars()
        )
        asked = [a for a in accounts if a.id not in have]
        for account in asked:
            self.session.add(
                PullReviewRequest(pull_id=pull.id, account_id=account.id, requested_by_id=actor.principal.account_id)
            )
        audit.record(
            self.session,
            actor,
            "repo.pull.request_review",
            f"{res.full_name}#{pull.number}",
            reviewers=[a.login for a in accounts],
        )
        await self.session.flush()
        if asked:  # `pull_request.review_requested` names those newly asked; a bot among them reviews
            refs = [AccountRef(login=a.login, type="Bot" if a.is_bot else "User") for a in asked]
            await self.pulls.publish(actor, res, pull, "review_requested", requested_reviewers=refs)
            await pull_review_agents.requested(self.pulls, actor, res, pull, asked)
        return pull

    async def _reviewers(self, res: RepoResource, pull: PullRequest, logins: list[str]) -> list[Account]:
        keys = sorted({login.strip().lower() for login in logins if login.strip()})
        found = list((await self.session.execute(select(Account).where(Account.login_key.in_(keys)))).scalars())
        roles = await resource_roles(self.session, res, [a.id for a in found])
        ok = [a for a in found if (roles.get(a.id) or Role.READ) >= Role.WRITE and a.id != pull.author_id]
        missing = sorted(set(keys) - {a.login_key for a in ok})
        if missing or not keys:
            raise InvalidInput(
                f"cannot request a review from {', '.join(missing) or 'nobody'}: reviewers are accounts with "
                "write access other than the author",
                code=Code.INVALID_REVIEWER,
                reviewers=missing,
            )
        return ok
