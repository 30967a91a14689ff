"""The inbox: one thread per person and subject, written by the notifier (`deliver`: a new row, or
the thread bumped: unread again, the newest reason, actor and time, out of `done`), read and marked
by its person (GitHub's notifications API: list with `all`/`participating`/`reason`, mark a thread
read, mark it done, mark all read)."""

from collections.abc import Sequence
from datetime import datetime
from typing import Literal

import msgspec
from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from forge.core.access import Role
from forge.core.error_codes import Code
from forge.core.errors import NotFound
from forge.db import audit
from forge.db.audit import Actor
from forge.db.engine import utcnow
from forge.db.models import Account, Repository
from forge.db.notify_models import Notification
from forge.notify.activity import Activity
from forge.notify.reasons import PARTICIPATING, SUBJECT_PATHS, SUBJECT_WIRE
from forge.notify.recipients import Recipient
from forge.notify.subscriptions import insert_for
from forge.repos.repositories import RepoResource, resource_roles

PER_PAGE_MAX = 50


class SubjectRead(msgspec.Struct, kw_only=True):
    title: str
    url: str  # the API's URL of the issue, pull request or task
    html_url: str
    type: Literal["Issue", "PullRequest", "Task"]
    number: int


class RepositoryRef(msgspec.Struct, kw_only=True):
    id: int
    name: str
    full_name: str
    html_url: str


class NotificationRead(msgspec.Struct, kw_only=True):
    """A thread as GitHub's notifications API shapes it, plus `done` and `last_actor`."""

    id: str
    unread: bool
    done: bool
    reason: str
    updated_at: datetime
    last_read_at: datetime | None
    last_actor: str | None
    subject: SubjectRead
    repository: RepositoryRef
    url: str
    subscription_url: str


class MarkedRead(msgspec.Struct, kw_only=True):
    marked_read: int


class Filters(msgspec.Struct, kw_only=True, frozen=True):
    all: bool = False  # read ones too (GitHub's `all`)
    participating: bool = False  # only those about the person, not watched repositories
    reason: str | None = None
    done: bool = False  # the ones marked done instead


async def deliver(
    session: AsyncSession, repo_id: int, act: Activity, recipients: Sequence[Recipient], actor_login: str
) -> None:
    """Each recipient's thread of the subject: written, or bumped."""
    if not recipients:
        return
    now = utcnow()
    s = act.subject
    rows = [
        {"account_id": r.account_id, "repo_id": repo_id, "subject_type": s.type, "subject_number": s.number,
         "subject_title": s.title[:256], "subject_url": s.url[:1000], "reason": r.reason, "unread": True,
         "done": False, "last_actor": actor_login[:40], "created_at": now, "updated_at": now}
        for r in recipients
    ]  # fmt: skip
    stmt = insert_for(session)(Notification).values(rows)
    stmt = stmt.on_conflict_do_update(
        index_elements=["account_id", "repo_id", "subject_type", "subject_number"],
        set_={
            name: stmt.excluded[name]
            for name in ("subject_title", "subject_url", "reason", "unread", "done", "last_actor", "updated_at")
        },
    )
    await session.execute(stmt)


def _query(account_id: int, filters: Filters):  # type: ignore[no-untyped-def]
    n = Notification
    stmt = select(n, Repository, Account.login).join(Repository, Repository.id == n.repo_id)
    stmt = stmt.join(Account, Account.id == Repository.owner_id).where(
        n.account_id == account_id, n.done.is_(filters.done)
    )
    if not filters.all and not filters.done:
        stmt = stmt.where(n.unread.is_(True))
    if filters.participating:
        stmt = stmt.where(n.reason.in_(sorted(PARTICIPATING)))
    if filters.reason:
        stmt = stmt.where(n.reason == filters.reason)
    return stmt


def to_read(row: Notification, repo: Repository, owner: str, base_url: str) -> NotificationRead:
    full = f"{owner}/{repo.name}"
    api = f"{base_url}/api/v1"
    return NotificationRead(
        id=str(row.id),
        unread=row.unread,
        done=row.done,
        reason=row.reason,
        updated_at=row.updated_at,
        last_read_at=row.last_read_at,
        last_actor=row.last_actor or None,
        subject=SubjectRead(
            title=row.subject_title,
            url=f"{api}/repos/{full}/{SUBJECT_PATHS[row.subject_type]}/{row.subject_number}",
            html_url=row.subject_url,
            type=SUBJECT_WIRE[row.subject_type],  # type: ignore[arg-type]
            number=row.subject_number,
        ),
        repository=RepositoryRef(id=repo.id, name=repo.name, full_name=full, html_url=f"{base_url}/{full}"),
        url=f"{api}/notifications/threads/{row.id}",
        subscription_url=f"{api}/notifications/threads/{row.id}/subscription",
    )


async def list_for(
    session: AsyncSession,
    account_id: int,
    filters: Filters,
    base_url: str,
    *,
    page: int = 1,
    per_page: int = PER_PAGE_MAX,
) -> list[NotificationRead]:
    """The person's threads, newest activity first."""
    stmt = _query(account_id, filters).order_by(Notification.updated_at.desc(), Notification.id.desc())
    stmt = stmt.limit(per_page).offset((page - 1) * per_page)
    rows = (await session.execute(stmt)).tuples().all()
    seen = await _readable(session, account_id, [(row, repo) for row, repo, _ in rows])
    return [to_read(row, repo, owner, base_url) for row, repo, owner in rows if row.id in seen]


async def _readable(session: AsyncSession, account_id: int, rows: list[tuple[Notification, Repository]]) -> set[int]:
    """The threads whose subject the person may still see: the repository readable now (a task
    needs the write role). What they lost access to stays in the table but is not shown."""
    roles: dict[int, Role | None] = {}
    for _, repo in rows:
        if repo.id not in roles:
            found = await resource_roles(session, RepoResource(repo), [account_id])
            roles[repo.id] = found.get(account_id)
    needed = {"task": Role.WRITE}
    return {
        row.id
        for row, repo in rows
        if (role := roles[repo.id]) is not None and role >= needed.get(row.subject_type, Role.READ)
    }


async def unread_count(session: AsyncSession, account_id: int) -> int:
    """The header's badge: one COUNT."""
    n = Notification
    stmt = select(func.count()).where(n.account_id == account_id, n.unread.is_(True), n.done.is_(False))
    return int((await session.execute(stmt)).scalar_one())


async def _own(session: AsyncSession, account_id: int, thread_id: int) -> Notification:
    row = await session.get(Notification, thread_id)
    if row is None or row.account_id != account_id:
        # Another person's thread answers like one that does not exist.
        raise NotFound(f"no notification thread {thread_id} in your inbox", code=Code.NOTIFICATION_NOT_FOUND)
    return row


async def get(session: AsyncSession, account_id: int, thread_id: int, base_url: str) -> NotificationRead:
    row = await _own(session, account_id, thread_id)
    repo = await session.get(Repository, row.repo_id)
    assert repo is not None
    if row.id not in await _readable(session, account_id, [(row, repo)]):
        raise NotFound(f"no notification thread {thread_id} in your inbox", code=Code.NOTIFICATION_NOT_FOUND)
    return to_read(row, repo, repo.owner.login, base_url)


async def mark(
    session: AsyncSession, actor: Actor, thread_id: int, base_url: str, *, done: bool = False
) -> NotificationRead:
    """Mark one thread read (and done, with `done`), audited."""
    account_id = actor.principal.account_id
    assert account_id is not None
    row = await _own(session, account_id, thread_id)
    row.unread = False
    row.last_read_at = utcnow()
    if done:
        row.done = True
    audit.record(session, actor, "notifications.done" if done else "notifications.read", str(thread_id))
    await session.flush()
    return await get(session, account_id, thread_id, base_url)


async def mark_all(session: AsyncSession, actor: Actor, before: datetime | None = None) -> MarkedRead:
    """Mark every unread thread (updated up to `before`, GitHub's `last_read_at`) read, audited."""
    n = Notification
    stmt = update(n).where(n.account_id == actor.principal.account_id, n.unread.is_(True))
    if before is not None:
        stmt = stmt.where(n.updated_at <= before)
    result = await session.execute(stmt.values(unread=False, last_read_at=utcnow()))
    count = int(getattr(result, "rowcount", 0) or 0)
    audit.record(session, actor, "notifications.read_all", actor.principal.login, count=count)
    return MarkedRead(marked_read=count)
