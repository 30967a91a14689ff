"""Server-side browser sessions and their CSRF tokens.

The cookie holds a random session id; the database keeps only its SHA-256, the account, a
per-session CSRF token (synchronizer pattern) and an expiry. Signing out deletes the row."""

import hmac
from datetime import timedelta

import msgspec
from sqlalchemy import delete, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from forge.core.access import Principal
from forge.core.security import random_id, sha256_hex
from forge.db.engine import Database, utcnow
from forge.db.models import Account, WebSession

SESSION_COOKIE = "fh_session"
# Before sign-in there is no session: the sign-in form uses a double-submit cookie instead.
PRESESSION_COOKIE = "fh_csrf"
_TOUCH_EVERY = timedelta(minutes=5)


class SessionInfo(msgspec.Struct, frozen=True):
    principal: Principal
    csrf_token: str
    # The account's password was generated: pages send it to the password page (`forge.http.pages.password_gate`).
    must_change_password: bool = False


async def create(session: AsyncSession, account: Account, *, days: int, client_addr: str, user_agent: str) -> str:
    """Create a session and return the cookie value (shown to the browser only)."""
    sid = random_id()
    session.add(
        WebSession(
            id_hash=sha256_hex(sid),
            account_id=account.id,
            csrf_token=random_id(24),
            client_addr=client_addr[:64],
            user_agent=user_agent[:300],
            expires_at=utcnow() + timedelta(days=days),
        )
    )
    await session.flush()
    return sid


async def resolve(db: Database, sid: str) -> SessionInfo | None:
    if not sid or len(sid) > 128:
        return None
    id_hash = sha256_hex(sid)
    async with db.session() as session:
        found = (
            await session.execute(
                select(WebSession, Account)
                .join(Account, Account.id == WebSession.account_id)
                .where(WebSession.id_hash == id_hash)
            )
        ).one_or_none()
    if found is None:
        return None
    row, account = found
    now = utcnow()
    if row.expires_at <= now or account.disabled or account.is_bot:
        return None
    if now - row.last_seen_at > _TOUCH_EVERY:
        await db.touch(update(WebSession).where(WebSession.id_hash == id_hash).values(last_seen_at=now))
    principal = Principal(
        account_id=account.id,
        login=account.login,
        type="User",
        is_admin=account.is_admin,
        display_name=account.display_name,
        created_at=account.created_at,
        via="session",
    )
    return SessionInfo(
        principal=principal, csrf_token=row.csrf_token, must_change_password=account.must_change_password
    )


async def destroy(session: AsyncSession, sid: str) -> None:
    await session.execute(delete(WebSession).where(WebSession.id_hash == sha256_hex(sid)))


async def destroy_all_for(session: AsyncSession, account_id: int, *, keep: str | None = None) -> int:
    """End every session of the account (but the one whose cookie is `keep`); returns how many ended."""
    stmt = delete(WebSession).where(WebSession.account_id == account_id)
    if keep:
        stmt = stmt.where(WebSession.id_hash != sha256_hex(keep))
    result = await session.execute(stmt)
    return int(getattr(result, "rowcount", 0) or 0)


def tokens_match(expected: str, given: str | None) -> bool:
    return bool(expected) and given is not None and hmac.compare_digest(expected.encode(), given.encode())
