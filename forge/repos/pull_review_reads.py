"""Reading the reviews and comments of a pull request, as a person sees them: a pending review
and its comments only for its author. `PullReviews` (forge/repos/pull_reviews.py) builds on it."""

from dataclasses import dataclass

from sqlalchemy import or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from forge.db.events import AccountRef
from forge.db.models import Account, PullComment, PullRequest, PullReview
from forge.repos.pull_shapes import PullCommentRead, PullReviewRead, ReviewState
from forge.repos.pulls import Pulls
from forge.repos.repositories import RepoResource
from forge.repos.suggestion_text import suggestion_of

_STATES: dict[str, ReviewState] = {
    "approve": "APPROVED",
    "request_changes": "CHANGES_REQUESTED",
    "comment": "COMMENTED",
    "pending": "PENDING",
}
PENDING = "pending"


@dataclass
class PullReviewReads:
    pulls: Pulls

    @property
    def session(self) -> AsyncSession:
        return self.pulls.session

    async def reviews(self, res: RepoResource, pull: PullRequest, viewer: int | None = None) -> list[PullReviewRead]:
        """The reviews, oldest first; a pending one only for its author (`viewer`)."""
        rows = (
            await self.session.execute(
                select(PullReview, Account)
                .outerjoin(Account, Account.id == PullReview.author_id)
                .where(
                    PullReview.pull_id == pull.id, or_(PullReview.verdict != PENDING, PullReview.author_id == viewer)
                )
                .order_by(PullReview.id)
            )
        ).all()
        url = self.pulls.html_url(res, pull.number)
        return [
            PullReviewRead(
                id=r.id,
                user=_ref(a),
                body=r.body,
                state="DISMISSED" if r.dismissed else _STATES[r.verdict],
                commit_id=r.commit_sha,
                submitted_at=r.created_at,
                html_url=f"{url}#review-{r.id}",
            )
            for r, a in rows
        ]

    async def comments(
        self, res: RepoResource, pull: PullRequest, *, on_lines: bool | None = None, viewer: int | None = None
    ) -> list[PullCommentRead]:
        """The comments, oldest first; those of a pending review only for its author (`viewer`)."""
        stmt = (
            select(PullComment, Account)
            .outerjoin(Account, Account.id == PullComment.author_id)
            .outerjoin(PullReview, PullReview.id == PullComment.review_id)
            .where(
                PullComment.pull_id == pull.id,
                or_(PullReview.id.is_(None), PullReview.verdict != PENDING, PullReview.author_id == viewer),
            )
            .order_by(PullComment.id)
        )
        if on_lines is not None:
            stmt = stmt.where(PullComment.path.is_not(None) if on_lines else PullComment.path.is_(None))
        url = self.pulls.html_url(res, pull.number)
        rows = (await self.session.execute(stmt)).all()
        resolvers = await self.pulls.accounts({c.resolved_by_id for c, _ in rows if c.resolved_by_id})
        return [
            PullCommentRead(
                id=c.id,
                user=_ref(a),
                body=c.body,
                path=c.path,
                line=c.line,
                side=c.side,
                commit_id=c.commit_sha,
                pull_request_review_id=c.review_id,
                outdated=c.path is not None and c.commit_sha != pull.head_sha,
                suggestion=suggestion_of(c.body) if c.path is not None and c.in_reply_to_id is None else None,
                in_reply_to_id=c.in_reply_to_id,
                resolved=c.resolved_at is not None,
                resolved_by=resolvers.get(c.resolved_by_id) if c.resolved_by_id else None,
                created_at=c.created_at,
                updated_at=c.updated_at,
                html_url=f"{url}#comment-{c.id}",
            )
            for c, a in rows
        ]


def _ref(account: Account | None) -> AccountRef | None:
    return AccountRef(login=account.login, type="Bot" if account.is_bot else "User") if account else None
