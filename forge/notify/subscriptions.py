"""Watching: how closely a person watches a repository (`all`, `participating` (the default),
`ignore`; GitHub's `subscribed`/`ignored` pair answers the same) and the threads they follow."""

from datetime import datetime
from typing import Any

import msgspec
from sqlalchemy import delete, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncSession

from forge.core.error_codes import Code
from forge.core.errors import InvalidInput
from forge.db import audit
from forge.db.audit import Actor
from forge.db.notify_models import NotificationThread, RepoSubscription
from forge.notify.activity import Subject
from forge.notify.reasons import DEFAULT_WATCH, WATCH_LEVELS, WatchLevel
from forge.repos.repositories import RepoResource


class SubscriptionPut(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """`PUT .../subscription`: GitHub's booleans, or forgehand's `level`."""

    subscribed: bool | None = None
    ignored: bool | None = None
    level: WatchLevel | None = None


class SubscriptionRead(msgspec.Struct, kw_only=True):
    subscribed: bool  # all activity
    ignored: bool
    level: WatchLevel
    reason: None = None  # GitHub's field; always null here
    created_at: datetime | None  # null: the default, never set
    url: str
    repository_url: str


def insert_for(session: AsyncSession) -> Any:
    """The dialect's INSERT, which knows ON CONFLICT (SQLite and PostgreSQL)."""
    return pg_insert if session.bind.dialect.name == "postgresql" else sqlite_insert


def level_of(data: SubscriptionPut) -> WatchLevel:
    """The level a PUT asks for; refuses a body that asks two things."""
    asked: set[str] = set()
    if data.level is not None:
        asked.add(data.level)
    if data.ignored:
        asked.add("ignore")
    if data.subscribed:
        asked.add("all")
    if data.subscribed is False and data.ignored is False:
        asked.add("participating")
    if len(asked) != 1 or not asked <= set(WATCH_LEVELS):
        raise InvalidInput(
            'say one of: {"subscribed": true} (all activity), {"ignored": true} (nothing), '
            '{"subscribed": false, "ignored": false} (participating), or {"level": "all|participating|ignore"}',
            code=Code.INVALID_SUBSCRIPTION,
        )
    level = asked.pop()
    assert level in WATCH_LEVELS
    return level


async def _row(session: AsyncSession, repo_id: int, account_id: int) -> RepoSubscription | None:
    stmt = select(RepoSubscription).where(
        RepoSubscription.repo_id == repo_id, RepoSubscription.account_id == account_id
    )
    return (await session.execute(stmt)).scalar_one_or_none()


def to_read(res: RepoResource, row: RepoSubscription | None, base_url: str) -> SubscriptionRead:
    level: WatchLevel = row.level if row is not None else DEFAULT_WATCH  # type: ignore[assignment]
    repo_url = f"{base_url}/api/v1/repos/{res.full_name}"
    return SubscriptionRead(
        subscribed=level == "all",
        ignored=level == "ignore",
        level=level,
        created_at=row.created_at if row is not None else None,
        url=f"{repo_url}/subscription",
        repository_url=repo_url,
    )


async def get(session: AsyncSession, res: RepoResource, account_id: int, base_url: str) -> SubscriptionRead:
    return to_read(res, await _row(session, res.repo.id, account_id), base_url)


async def put(
    session: AsyncSession, actor: Actor, res: RepoResource, level: WatchLevel, base_url: str
) -> SubscriptionRead:
    """Watch the repository at `level` (audited)."""
    account_id = actor.principal.account_id
    assert account_id is not None
    row = await _row(session, res.repo.id, account_id)
    if row is None:
        row = RepoSubscription(repo_id=res.repo.id, account_id=account_id, level=level)
        session.add(row)
    row.level = level
    audit.record(session, actor, "notifications.watch", res.full_name, level=level)
    await session.flush()
    return to_read(res, row, base_url)


async def remove(session: AsyncSession, actor: Actor, res: RepoResource) -> None:
    """Back to the default (`participating`), audited."""
    stmt = delete(RepoSubscription).where(
        RepoSubscription.repo_id == res.repo.id, RepoSubscription.account_id == actor.principal.account_id
    )
    await session.execute(stmt)
    audit.record(session, actor, "notifications.watch", res.full_name, level=DEFAULT_WATCH)


async def levels(session: AsyncSession, repo_id: int) -> dict[int, str]:
    """Who set a level on this repository, and which (the rest are `participating`)."""
    stmt = select(RepoSubscription.account_id, RepoSubscription.level).where(RepoSubscription.repo_id == repo_id)
    return dict((await session.execute(stmt)).tuples().all())


async def followers(session: AsyncSession, repo_id: int, subject: Subject) -> dict[int, tuple[str, bool]]:
    """Who follows the thread: account id -> (why, ignored)."""
    t = NotificationThread
    stmt = select(t.account_id, t.reason, t.ignored).where(
        t.repo_id == repo_id, t.subject_type == subject.type, t.subject_number == subject.number
    )
    return {account_id: (reason, ignored) for account_id, reason, ignored in (await session.execute(stmt)).all()}


async def follow(session: AsyncSession, repo_id: int, subject: Subject, who: dict[int, str]) -> None:
    """These accounts follow the thread from now on (for these reasons); one that follows already
    keeps its row (and an ignored thread stays ignored)."""
    if not who:
        return
    rows = [
        {"account_id": a, "repo_id": repo_id, "subject_type": subject.type, "subject_number": subject.number,
         "reason": reason, "ignored": False}
        for a, reason in sorted(who.items())
    ]  # fmt: skip
    stmt = insert_for(session)(NotificationThread).values(rows).on_conflict_do_nothing()
    await session.execute(stmt)


async def ignore_thread(session: AsyncSession, account_id: int, repo_id: int, subject_type: str, number: int) -> None:
    """The person hears of the thread only when it names them (a mention, an assignment ...)."""
    row = {"account_id": account_id, "repo_id": repo_id, "subject_type": subject_type, "subject_number": number,
           "reason": "manual", "ignored": True}  # fmt: skip
    stmt = insert_for(session)(NotificationThread).values(row)
    stmt = stmt.on_conflict_do_update(
        index_elements=["repo_id", "subject_type", "subject_number", "account_id"], set_={"ignored": True}
    )
    await session.execute(stmt)
