"""Who hears of an activity, and why (`resolve`): the accounts it mentions (at most
`MENTION_CAP`), names (assignees, requested reviewers, a task's starter), the thread's followers and
the repository's watchers, each with their strongest reason; then without the actor, without
anyone who cannot read the repository (the write role for a task: `forge.core.access`, through
`resource_roles`), without those who ignore the repository (or the thread, unless it names them),
and without reasons a person turned off."""

from dataclasses import dataclass

import structlog
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from forge.core.access import Principal, Role
from forge.db import audit
from forge.db.audit import Actor
from forge.db.models import Account
from forge.notify import preferences, subscriptions
from forge.notify.activity import Activity
from forge.notify.reasons import DIRECT, Channel, stronger
from forge.repos.mentions import MENTION_CAP, capped
from forge.repos.repositories import RepoResource, resource_roles

log = structlog.get_logger("forgehand.notify")


@dataclass(frozen=True)
class Recipient:
    account_id: int
    reason: str
    channel: Channel  # web or email
    email: str  # "" unless the channel is email


class _Candidates(dict[int, str]):
    def add(self, account_id: int, reason: str) -> None:
        self[account_id] = stronger(self[account_id], reason) if account_id in self else reason


async def _ids_of(session: AsyncSession, logins: list[str]) -> dict[str, int]:
    """Login (lower case) -> account id, for the logins that exist."""
    keys = sorted({login.lower() for login in logins})
    if not keys:
        return {}
    rows = await session.execute(select(Account.login_key, Account.id).where(Account.login_key.in_(keys)))
    return dict(rows.tuples().all())


def _cap_mentions(session: AsyncSession, res: RepoResource, act: Activity, actor: str) -> list[str]:
    mentions, dropped = capped(act.mentions)
    if dropped:
        # Documented (docs/notifications.md, "Mentions"): the rest of a mention storm is dropped.
        log.warning("mention cap", repository=res.full_name, subject=act.subject.number, dropped=dropped)
        audit.record(
            session, Actor(principal=Principal(account_id=None, login=actor[:40], via="internal")),
            "notifications.mention_cap", f"{res.full_name}#{act.subject.number}",
            mentioned=len(act.mentions), notified_at_most=MENTION_CAP, dropped=dropped,
        )  # fmt: skip
    return mentions


async def _named(
    session: AsyncSession, res: RepoResource, act: Activity, actor: str
) -> tuple[_Candidates, dict[int, str]]:
    """Who the activity names (mentions, assignees, reviewers, a task's starter) and who starts
    following the thread."""
    mentions = _cap_mentions(session, res, act, actor)
    ids = await _ids_of(session, mentions + [login for login, _ in act.direct + act.follows])
    named = _Candidates()
    for login in mentions:
        if login.lower() in ids:
            named.add(ids[login.lower()], "mention")
    for login, reason in act.direct:
        if login.lower() in ids:
            named.add(ids[login.lower()], reason)
    for account_id, reason in act.direct_ids:
        named.add(account_id, reason)
    follows: dict[int, str] = {ids[login.lower()]: reason for login, reason in act.follows if login.lower() in ids}
    return named, follows


async def _followers(session: AsyncSession, res: RepoResource, act: Activity, into: _Candidates) -> set[int]:
    """Add the thread's followers (when the activity tells them); returns who ignores the thread."""
    found = await subscriptions.followers(session, res.repo.id, act.subject)
    ignoring = {a for a, (_reason, ignored) in found.items() if ignored}
    if act.followers is None:
        return ignoring
    for account_id, (why, ignored) in found.items():
        if ignored or (act.authors_only and why != "author"):
            continue
        into.add(account_id, "author" if why == "author" else act.followers)
    return ignoring


async def resolve(session: AsyncSession, res: RepoResource, act: Activity, actor_login: str) -> list[Recipient]:
    """Who is told of `act` (see the module's docstring); the named and the followers start
    following the thread as a side effect (those who can read it)."""
    candidates, follows = await _named(session, res, act, actor_login)
    ignoring = await _followers(session, res, act, candidates)
    levels = await subscriptions.levels(session, res.repo.id)
    if act.watchers:
        for account_id, level in levels.items():
            if level == "all":
                candidates.add(account_id, "subscribed")
    roles = await resource_roles(session, res, sorted(set(candidates) | set(follows)))
    floor = Role.WRITE if act.needs_write else Role.READ

    def may_read(account_id: int) -> bool:
        role = roles.get(account_id)
        return role is not None and role >= floor

    if not act.needs_write:
        new_follows = {a: r for a, r in candidates.items() if r in DIRECT and may_read(a)} | follows
        await subscriptions.follow(
            session, res.repo.id, act.subject, {a: r for a, r in new_follows.items() if may_read(a)}
        )
    actor_id = (await _ids_of(session, [actor_login])).get(actor_login.lower()) if actor_login else None
    kept = {
        a: reason
        for a, reason in candidates.items()
        if a != actor_id and may_read(a) and levels.get(a) != "ignore" and (a not in ignoring or reason in DIRECT)
    }
    return await _with_channels(session, kept)


async def _with_channels(session: AsyncSession, kept: dict[int, str]) -> list[Recipient]:
    prefs = await preferences.of_accounts(session, sorted(kept))
    out: list[Recipient] = []
    for account_id, reason in sorted(kept.items()):
        mine = prefs[account_id]
        channel = mine.channels.get(reason, "web")
        if channel == "off":
            continue
        email = mine.email if channel == "email" else ""
        out.append(Recipient(account_id, reason, "email" if email else "web", email))
    return out
