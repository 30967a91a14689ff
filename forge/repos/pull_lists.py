"""Lists of pull requests across the forge: the open ones of a repository by head branch (what a
push answers with), and the ones awaiting a person's review (the dashboard)."""

from collections.abc import Sequence

import msgspec
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from forge.core.access import Action, Principal, can
from forge.db.models import Account, PullRequest, PullReview, PullReviewRequest
from forge.repos.repositories import RepoResource

# The mapping rides to git in one environment variable (the push context), which the kernel caps
# at 128 KiB: the most recently active pull requests only; a push to another branch answers with
# the link that opens one.
MAX_LINKED = 200


async def open_pull_numbers(session: AsyncSession, res: RepoResource) -> dict[str, int]:
    """head branch -> the number of its open pull request into the default branch (or any base)."""
    rows = await session.execute(
        select(PullRequest.head_ref, PullRequest.base_ref, PullRequest.number)
        .where(PullRequest.repo_id == res.repo.id, PullRequest.state == "open")
        .order_by(PullRequest.updated_at.desc())
        .limit(MAX_LINKED)
    )
    found: dict[str, int] = {}
    for head, base, number in rows.all():
        if head not in found or base == res.repo.default_branch:
            found[head] = number
    return found


class AwaitingReview(msgspec.Struct, kw_only=True):
    """An open pull request the person can review and has not reviewed at its head."""

    repository: str
    number: int
    title: str
    author: str
    requested: bool  # the person's review was asked for
    html_url: str


async def awaiting_review(
    session: AsyncSession, principal: Principal, repos: Sequence[RepoResource], base_url: str, limit: int = 20
) -> list[AwaitingReview]:
    """The dashboard's pull requests for `principal`: open ones in repositories where they may
    review, by someone else, without their review of the current head; requested ones first."""
    me = principal.account_id
    by_id = {r.repo.id: r for r in repos if me is not None and can(principal, Action.PULL_REVIEW, r)}
    if not by_id:
        return []
    reviewed = select(PullReview.id).where(
        PullReview.pull_id == PullRequest.id,
        PullReview.author_id == me,
        PullReview.commit_sha == PullRequest.head_sha,
        PullReview.verdict != "pending",
    )
    requested = select(PullReviewRequest.id).where(
        PullReviewRequest.pull_id == PullRequest.id, PullReviewRequest.account_id == me
    )
    rows = await session.execute(
        select(PullRequest, Account.login, requested.exists())
        .outerjoin(Account, Account.id == PullRequest.author_id)
        .where(
            PullRequest.repo_id.in_(list(by_id)),
            PullRequest.state == "open",
            PullRequest.draft.is_(False),
            PullRequest.author_id.is_distinct_from(me),
            ~reviewed.exists(),
        )
        .order_by(requested.exists().desc(), PullRequest.updated_at.desc())
        .limit(limit)
    )
    return [
        AwaitingReview(
            repository=by_id[p.repo_id].full_name,
            number=p.number,
            title=p.title,
            author=login or "",
            requested=bool(asked),
            html_url=f"{base_url}/{by_id[p.repo_id].full_name}/pull/{p.number}",
        )
        for p, login, asked in rows.all()
    ]
