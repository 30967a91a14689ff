"""What a pull request's conversation shows besides reviews and comments: the pushes to its head
branch since it was opened, the statuses reported on the commits it was at, the pull requests opened
into its head branch meanwhile (stacked on it: an agent asked to work on it proposes its result
so), and its merge, each as a timeline entry in time order (GitHub's conversation)."""

from datetime import datetime

import msgspec
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from forge.db.models import Account, CommitStatus, PullRequest, PushRecord

MAX_ENTRIES = 200  # of each kind, the latest


class HistoryEntry(msgspec.Struct, frozen=True, kw_only=True):
    kind: str  # "push" | "status" | "stacked" | "merged"
    at: datetime
    who: str  # a login, or ""
    before: str = ""  # push: the head before
    after: str = ""  # push: the head after; status: the commit it is about
    state: str = ""  # status: pending | success | failure | error; stacked: open | closed | merged
    context: str = ""
    description: str = ""
    number: int = 0  # stacked: the pull request opened into this one's head branch
    title: str = ""  # stacked: its title


async def stacked(session: AsyncSession, pull: PullRequest) -> list[HistoryEntry]:
    """The pull requests opened into `pull`'s head branch while it was open, by anyone."""
    query = (
        select(PullRequest, Account.login)
        .outerjoin(Account, Account.id == PullRequest.author_id)
        .where(
            PullRequest.repo_id == pull.repo_id,
            PullRequest.base_ref == pull.head_ref,
            PullRequest.id != pull.id,
            PullRequest.created_at >= pull.created_at,
        )
        .order_by(PullRequest.id.desc())
        .limit(MAX_ENTRIES)
    )
    if pull.closed_at is not None:
        query = query.where(PullRequest.created_at <= pull.closed_at)
    rows = await session.execute(query)
    return [
        HistoryEntry(kind="stacked", at=p.created_at, who=login or "", state=p.state, number=p.number, title=p.title)
        for p, login in rows.all()
    ]


async def history(session: AsyncSession, pull: PullRequest) -> list[HistoryEntry]:
    ref = f"refs/heads/{pull.head_ref}"
    rows = await session.execute(
        select(PushRecord, Account.login)
        .outerjoin(Account, Account.id == PushRecord.pusher_id)
        .where(PushRecord.repo_id == pull.repo_id, PushRecord.at >= pull.created_at)
        .order_by(PushRecord.id.desc())
        .limit(MAX_ENTRIES * 5)
    )
    pushes = [
        HistoryEntry(kind="push", at=record.at, who=login or "", before=r.get("before", ""), after=r.get("after", ""))
        for record, login in rows.all()
        for r in record.refs
        if r.get("ref") == ref and (r.get("after") or "").strip("0")
    ][:MAX_ENTRIES]
    shas = {p.after for p in pushes} | ({pull.head_sha} if pull.head_sha else set())
    found = await session.execute(
        select(CommitStatus, Account.login)
        .outerjoin(Account, Account.id == CommitStatus.creator_id)
        .where(CommitStatus.repo_id == pull.repo_id, CommitStatus.sha.in_(shas))
        .order_by(CommitStatus.id.desc())
        .limit(MAX_ENTRIES)
    )
    statuses = [
        HistoryEntry(
            kind="status",
            at=s.created_at,
            who=login or "",
            after=s.sha,
            state=s.state,
            context=s.context,
            description=s.description,
        )
        for s, login in found.all()
    ]
    merged = [HistoryEntry(kind="merged", at=pull.merged_at, who="")] if pull.merged_at else []
    return pushes + statuses + await stacked(session, pull) + merged
