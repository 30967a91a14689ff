"""Personal access tokens: `fh_` + 40 random characters, shown once, stored as SHA-256 + last eight."""

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timedelta

import msgspec
from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession

from forge.core.access import AccountRef, Action, Principal, Scope, can, expand_scopes, parse_scopes, require
from forge.core.error_codes import Code
from forge.core.errors import InvalidInput, NotFound, Unauthenticated
from forge.core.security import generate_token, looks_like_token, sha256_hex
from forge.core.text import require_no_nul
from forge.db import audit
from forge.db.audit import Actor
from forge.db.engine import Database, utcnow
from forge.db.models import AccessToken, Account

MAX_EXPIRY_DAYS = 3650
# last_used_at is a hint, not an audit trail: write it at most once a minute per token.
_LAST_USED_GRANULARITY = timedelta(minutes=1)


class TokenRead(msgspec.Struct, kw_only=True):
    id: int
    name: str
    owner: str
    scopes: list[str]
    last_eight: str
    created_at: datetime
    expires_at: datetime | None
    last_used_at: datetime | None
    revoked: bool


class TokenCreated(msgspec.Struct, kw_only=True):
    token: str  # shown once
    info: TokenRead


def to_read(row: AccessToken, owner_login: str) -> TokenRead:
    return TokenRead(
        id=row.id,
        name=row.name,
        owner=owner_login,
        scopes=sorted(row.scopes.split()),
        last_eight=row.last_eight,
        created_at=row.created_at,
        expires_at=row.expires_at,
        last_used_at=row.last_used_at,
        revoked=row.revoked_at is not None,
    )


async def create(
    session: AsyncSession,
    actor: Actor,
    owner: Account,
    name: str,
    scopes: Sequence[str],
    expires_days: int | None = None,
) -> TokenCreated:
    require(actor.principal, Action.ACCOUNT_MANAGE, AccountRef(owner.id, owner.owner_id))
    name = require_no_nul(name.strip(), "a token name")
    if not name or len(name) > 100:
        raise InvalidInput("a token name is 1-100 characters", code=Code.INVALID_TOKEN_NAME)
    granted = parse_scopes(scopes)
    if Scope.ADMIN in granted and not owner.is_admin:
        raise InvalidInput("only instance admins can hold the 'admin' scope", code=Code.INVALID_SCOPE)
    if owner.disabled:
        raise InvalidInput("the account is disabled", code=Code.ACCOUNT_DISABLED)
    expires_at = None
    if expires_days is not None:
        if not 1 <= expires_days <= MAX_EXPIRY_DAYS:
            raise InvalidInput(f"expiry is 1-{MAX_EXPIRY_DAYS} days", code=Code.INVALID_EXPIRY)
        expires_at = utcnow() + timedelta(days=expires_days)
    secret = generate_token()
    row = AccessToken(
        account_id=owner.id,
        name=name,
        token_hash=sha256_hex(secret),
        last_eight=secret[-8:],
        scopes=" ".join(sorted(s.value for s in granted)),
        expires_at=expires_at,
        created_by_id=actor.principal.account_id,
    )
    session.add(row)
    await session.flush()
    audit.record(session, actor, "token.create", f"token:{row.id}", owner=owner.login, scopes=row.scopes.split())
    return TokenCreated(token=secret, info=to_read(row, owner.login))


async def list_for(session: AsyncSession, owner: Account, *, include_revoked: bool = False) -> list[TokenRead]:
    stmt = select(AccessToken).where(AccessToken.account_id == owner.id).order_by(AccessToken.id)
    if not include_revoked:
        stmt = stmt.where(AccessToken.revoked_at.is_(None))
    return [to_read(r, owner.login) for r in (await session.execute(stmt)).scalars()]


async def revoke(session: AsyncSession, actor: Actor, token_id: int, cache: "TokenCache | None" = None) -> TokenRead:
    row = await session.get(AccessToken, token_id)
    owner = await session.get(Account, row.account_id) if row else None
    if row is None or owner is None:
        raise NotFound(f"no token {token_id}", code=Code.TOKEN_NOT_FOUND)
    # Someone who may not manage the owner's tokens does not learn that the token exists.
    ref = AccountRef(owner.id, owner.owner_id)
    if not can(actor.principal, Action.ACCOUNT_MANAGE, ref):
        if actor.principal.account_id not in {owner.id, owner.owner_id}:
            raise NotFound(f"no token {token_id}", code=Code.TOKEN_NOT_FOUND)
        require(actor.principal, Action.ACCOUNT_MANAGE, ref)  # their own: say why (a token, say)
    if row.revoked_at is None:
        row.revoked_at = utcnow()
        audit.record(session, actor, "token.revoke", f"token:{row.id}", owner=owner.login)
    if cache is not None:
        cache.forget(row.token_hash)
    return to_read(row, owner.login)


class TokenCache:
    """A short in-process cache of validated tokens, so an API call does not always hit the database.

    Revocation in this process takes effect at once; in another replica within `ttl` seconds."""

    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self._entries: dict[str, tuple[float, Principal, datetime | None]] = {}
        # One lookup per token at a time: the requests a client sends at once with a token this
        # process has not seen share it (300 of them used to be 300 reads and 300 writes).
        self._loading: dict[str, asyncio.Future[Principal]] = {}

    async def once(self, token_hash: str, load: Callable[[], Awaitable[Principal]]) -> Principal:
        """`load()`'s principal, shared by every caller that asks while it runs (on this loop)."""
        pending = self._loading.get(token_hash)
        if pending is None or pending.get_loop() is not asyncio.get_running_loop():
            pending = asyncio.ensure_future(load())
            self._loading[token_hash] = pending
            pending.add_done_callback(lambda done: self._forget_loading(token_hash, done))
        try:
            return await asyncio.shield(pending)
        except Unauthenticated as exc:  # each request raises (and audits) its own
            raise Unauthenticated(exc.detail, code=exc.code) from None

    def _forget_loading(self, token_hash: str, done: "asyncio.Future[Principal]") -> None:
        if self._loading.get(token_hash) is done:
            del self._loading[token_hash]
        if not done.cancelled():
            done.exception()  # retrieved: the waiters got it

    def get(self, token_hash: str) -> Principal | None:
        entry = self._entries.get(token_hash)
        if entry is None:
            return None
        stored_at, principal, expires_at = entry
        if time.monotonic() - stored_at > self.ttl or (expires_at is not None and expires_at <= utcnow()):
            self._entries.pop(token_hash, None)
            return None
        return principal

    def put(self, token_hash: str, principal: Principal, expires_at: datetime | None) -> None:
        if self.ttl <= 0:
            return
        if len(self._entries) > 10_000:
            self._entries.clear()
        self._entries[token_hash] = (time.monotonic(), principal, expires_at)

    def forget(self, token_hash: str) -> None:
        self._entries.pop(token_hash, None)

    def clear(self) -> None:
        self._entries.clear()


async def resolve(db: Database, cache: TokenCache, secret: str) -> Principal:
    """Turn a presented token into a principal, or raise Unauthenticated with a stable code."""
    if not looks_like_token(secret):
        raise Unauthenticated("malformed token", code=Code.INVALID_TOKEN)
    token_hash = sha256_hex(secret)
    cached = cache.get(token_hash)
    if cached is not None:
        return cached
    return await cache.once(token_hash, lambda: _lookup(db, cache, token_hash))


async def _lookup(db: Database, cache: TokenCache, token_hash: str) -> Principal:
    async with db.session() as session:
        found = (
            await session.execute(
                select(AccessToken, Account)
                .join(Account, Account.id == AccessToken.account_id)
                .where(AccessToken.token_hash == token_hash)
            )
        ).one_or_none()
    if found is None:
        raise Unauthenticated("unknown token", code=Code.INVALID_TOKEN)
    row, account = found
    now = utcnow()
    if row.revoked_at is not None:
        raise Unauthenticated("this token was revoked", code=Code.TOKEN_REVOKED)
    if row.expires_at is not None and row.expires_at <= now:
        raise Unauthenticated("this token has expired", code=Code.TOKEN_EXPIRED)
    if account.disabled:
        raise Unauthenticated("this account is disabled", code=Code.ACCOUNT_DISABLED)
    granted = [Scope(s) for s in row.scopes.split()]
    # An admin scope held by an account that is no longer admin grants nothing extra.
    if not account.is_admin:
        granted = [s for s in granted if s is not Scope.ADMIN]
    principal = Principal(
        account_id=account.id,
        login=account.login,
        type="Bot" if account.is_bot else "User",
        is_admin=account.is_admin,
        display_name=account.display_name,
        created_at=account.created_at,
        via="token",
        token_id=row.id,
        scopes=expand_scopes(granted),
    )
    if row.last_used_at is None or now - row.last_used_at > _LAST_USED_GRANULARITY:
        await db.touch(update(AccessToken).where(AccessToken.id == row.id).values(last_used_at=now))
    cache.put(token_hash, principal, row.expires_at)
    return principal
