"""What a pull request's conversation shows besides reviews and comments: the pushes to its head
branch since it was opened, the statuses reported on the commits it was at, and its merge, each as
a timeline entry in time order (GitHub's conversation)."""

from datetime import datetime

import msgspec
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from forge.db.models import Account, CommitStatus, PullRequest, PushRecord

MAX_ENTRIES = 200  # of each kind, the latest


class HistoryEntry(msgspec.Struct, frozen=True, kw_only=True):
    kind: str  # "push" | "status" | "merged"
    at: datetime
    who: str  # a login, or ""
    before: str = ""  # push: the head before
    after: str = ""  # push: the head after; status: the commit it is about
    state: str = ""  # status: pending | success | failure | error
    context: str = ""
    description: str = ""


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
    return pushes + statuses + merged
