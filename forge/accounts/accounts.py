"""Accounts: people and bots, sign-in with a rate limit on failures."""

import re
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Literal

import msgspec
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from forge.accounts import initial_password, websessions
from forge.core.access import INSTANCE, Action, require
from forge.core.error_codes import Code
from forge.core.errors import Conflict, Forbidden, InvalidInput, NotFound, RateLimited, Unauthenticated
from forge.core.security import hash_password, verify_password
from forge.core.settings import Settings
from forge.core.text import NUL, require_no_nul, without_nul
from forge.db import audit
from forge.db.audit import Actor
from forge.db.engine import Database, utcnow
from forge.db.models import Account, AccountType

_LOGIN_RE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9]|-(?=[A-Za-z0-9])){0,38}$")
# Names that would collide with routes at the root of the site.
RESERVED_LOGINS = frozenset(
    {
        "api",
        "admin",
        "static",
        "login",
        "logout",
        "signin",
        "signout",
        "settings",
        "healthz",
        "metrics",
        "user",
        "users",
        "tokens",
        "new",
        "explore",
        "assets",
        "forgehand",
        "tasks",
        "repos",
        "notifications",
        "git",
        "favicon.ico",  # cannot be a login (no dots), but every first path segment of a route is listed
    }
)
MIN_PASSWORD = 10


class AccountRead(msgspec.Struct, kw_only=True):
    id: int
    login: str
    type: Literal["User", "Bot"]
    display_name: str
    is_admin: bool
    disabled: bool
    owner: str | None
    created_at: datetime
    # The password was generated and not yet changed: the next sign-in must choose one.
    must_change_password: bool = False


def validate_login(login: str) -> str:
    if not _LOGIN_RE.fullmatch(login):
        raise InvalidInput(
            "a login is 1-39 letters, digits or single hyphens, not starting or ending with a hyphen",
            code=Code.INVALID_LOGIN,
        )
    if login.lower() in RESERVED_LOGINS:
        raise InvalidInput(f"{login!r} is reserved", code=Code.INVALID_LOGIN)
    return login


def validate_password(password: str) -> str:
    if len(password) < MIN_PASSWORD:
        raise InvalidInput(f"a password needs at least {MIN_PASSWORD} characters", code=Code.WEAK_PASSWORD)
    if len(password) > 1024:
        raise InvalidInput("a password is at most 1024 characters", code=Code.INVALID_PASSWORD)
    return password


async def to_read(session: AsyncSession, account: Account) -> AccountRead:
    owner = None
    if account.owner_id is not None:
        owner_row = await session.get(Account, account.owner_id)
        owner = owner_row.login if owner_row else None
    return AccountRead(
        id=account.id,
        login=account.login,
        type="Bot" if account.is_bot else "User",
        display_name=account.display_name,
        is_admin=account.is_admin,
        disabled=account.disabled,
        owner=owner,
        created_at=account.created_at,
        must_change_password=account.must_change_password,
    )


async def get_by_login(session: AsyncSession, login: str) -> Account | None:
    if NUL in login or len(login) > 100:
        return None  # cannot be a login; and PostgreSQL refuses NUL in a query
    return (await session.execute(select(Account).where(Account.login_key == login.lower()))).scalar_one_or_none()


async def require_by_login(session: AsyncSession, login: str) -> Account:
    account = await get_by_login(session, login)
    if account is None:
        raise NotFound(f"no account {login!r}", code=Code.ACCOUNT_NOT_FOUND)
    return account


async def _ensure_free(session: AsyncSession, login: str) -> None:
    if await get_by_login(session, login) is not None:
        raise Conflict(f"the login {login!r} is taken", code=Code.LOGIN_TAKEN)


async def _add_account(
    session: AsyncSession, login: str, kind: AccountType, display_name: str, **fields: Any
) -> Account:
    """Add a new account row (flushed, so it has an id); the login was checked to be valid and free."""
    account = Account(
        login=login,
        login_key=login.lower(),
        type=kind,
        display_name=require_no_nul(display_name[:200], "a display name"),
        **fields,
    )
    session.add(account)
    await session.flush()
    return account


async def create_user(
    session: AsyncSession,
    actor: Actor,
    login: str,
    password: str,
    *,
    is_admin: bool = False,
    display_name: str = "",
    must_change_password: bool = False,
) -> Account:
    """A person's account. `must_change_password` for a generated password (someone else saw it):
    the person chooses their own at first sign-in."""
    validate_login(login)
    validate_password(password)
    await _ensure_free(session, login)
    account = await _add_account(
        session,
        login,
        AccountType.USER,
        display_name,
        password_hash=await hash_password(password),
        is_admin=is_admin,
        must_change_password=must_change_password,
    )
    audit.record(session, actor, "user.create", login, is_admin=is_admin, must_change_password=must_change_password)
    return account


async def create_bot(
    session: AsyncSession, actor: Actor, login: str, *, owner: Account | None = None, display_name: str = ""
) -> Account:
    validate_login(login)
    await _ensure_free(session, login)
    account = await _add_account(
        session, login, AccountType.BOT, display_name, password_hash=None, owner_id=owner.id if owner else None
    )
    audit.record(session, actor, "bot.create", login, owner=owner.login if owner else None)
    return account


async def set_disabled(session: AsyncSession, actor: Actor, login: str, disabled: bool) -> Account:
    account = await require_by_login(session, login)
    if disabled and account.id == actor.principal.account_id:
        raise InvalidInput("you cannot disable your own account", code=Code.CANNOT_DISABLE_SELF)
    account.disabled = disabled
    audit.record(session, actor, "user.disable" if disabled else "user.enable", account.login)
    return account


async def update_profile(session: AsyncSession, actor: Actor, display_name: str) -> Account:
    """The signed-in person changes what their profile shows (the display name, at most 200
    characters; blank: the login alone)."""
    account_id = actor.principal.account_id
    account = await session.get(Account, account_id) if account_id is not None else None
    if account is None:
        raise Unauthenticated("sign in first", code=Code.UNAUTHENTICATED)
    name = display_name.strip()
    if len(name) > 200:
        raise InvalidInput("a display name is at most 200 characters", code=Code.VALIDATION_FAILED)
    name = require_no_nul(name, "a display name")
    if name != account.display_name:
        account.display_name = name
        audit.record(session, actor, "user.profile.update", account.login, display_name=True)
    return account


async def list_accounts(session: AsyncSession, *, type_: str | None = None) -> Sequence[Account]:
    stmt = select(Account).order_by(Account.login_key)
    if type_ is not None:
        stmt = stmt.where(Account.type == type_)
    return (await session.execute(stmt)).scalars().all()


async def count_accounts(session: AsyncSession) -> int:
    return len((await session.execute(select(Account.id).limit(1))).all())


async def authenticate_password(db: Database, settings: Settings, actor: Actor, login: str, password: str) -> Account:
    """Check a sign-in. Failures are audited and rate-limited per login and per client address.

    The attempt is written as a refusal *before* the (slow) password check, in the same write
    transaction that counts earlier failures: parallel guesses see each other and cannot slip
    past the limit together. A successful attempt removes its row (the caller audits the sign-in)."""
    target = without_nul(login.lower()[:40])
    since = audit.window_start(settings.signin_window_seconds)
    max_login, max_addr = settings.signin_max_failures, 4 * settings.signin_max_failures
    oldest = None
    async with db.session(write=True) as session:
        per_login = await audit.count_refusals_since(session, "auth.sign_in", since, target=target)
        per_addr = (
            await audit.count_refusals_since(session, "auth.sign_in", since, client_addr=actor.client_addr)
            if actor.client_addr
            else 0
        )
        limited = per_login >= max_login or per_addr >= max_addr
        if limited:
            oldest = await audit.oldest_refusal_since(
                session,
                "auth.sign_in",
                since,
                target=target if per_login >= max_login else None,
                client_addr=None if per_login >= max_login else actor.client_addr,
            )
            audit.record_refused(session, actor, "auth.sign_in.limited", target)
            account = None
            attempt_id = None
        else:
            attempt_id = await audit.record_attempt(session, actor, "auth.sign_in", target, reason="pending")
            account = await get_by_login(session, login)
    if limited:
        retry = settings.signin_window_seconds
        if oldest is not None:
            retry = max(1, int(settings.signin_window_seconds - (utcnow() - oldest).total_seconds()) + 1)
        raise RateLimited("too many failed sign-ins; try again later", retry_after=retry)
    # Always verify (against a dummy hash when there is no account) so timing does not tell.
    ok = await verify_password(account.password_hash if account else None, password)
    reason = None
    if not ok or account is None:
        reason = "bad_credentials"
    elif account.disabled:
        reason = "disabled"
    elif account.is_bot:
        reason = "bot"
    async with db.session(write=True) as session:
        await audit.settle_attempt(session, attempt_id, reason)
    if reason is not None or account is None:
        if reason == "disabled":
            raise Unauthenticated("this account is disabled", code=Code.ACCOUNT_DISABLED)
        raise Unauthenticated("wrong login or password", code=Code.BAD_CREDENTIALS)
    return account


async def change_password(
    db: Database,
    settings: Settings,
    actor: Actor,
    current: str,
    new: str,
    *,
    keep_session: str | None,
) -> None:
    """The signed-in person changes their own password: the current one is checked (failures are
    audited and rate-limited like sign-ins), every other session of the account ends, the one
    `keep_session` names (the cookie of the request) stays. Tokens are separate credentials and
    keep working (revoke them on the tokens page). A generated password's "must change" ends, and
    the first admin's password file goes (it would hold a password that no longer works)."""
    account_id = actor.principal.account_id
    if account_id is None or actor.principal.via != "session":
        # A token must not be able to take the account over.
        raise Forbidden("change your password in a signed-in browser session")
    validate_password(new)
    target = actor.principal.login.lower()
    since = audit.window_start(settings.signin_window_seconds)
    async with db.session() as session:
        failures = await audit.count_refusals_since(session, "user.password.change", since, target=target)
        account = await session.get(Account, account_id)
    if account is None:
        raise Unauthenticated("sign in first", code=Code.UNAUTHENTICATED)
    if failures >= settings.signin_max_failures:
        await audit.record_refusal(db, actor, "user.password.change", target, reason="limited")
        raise RateLimited("too many wrong passwords; try again later", retry_after=settings.signin_window_seconds)
    if not await verify_password(account.password_hash, current):
        await audit.record_refusal(db, actor, "user.password.change", target, reason="wrong_password")
        raise Forbidden("the current password is wrong", code=Code.WRONG_PASSWORD)
    if new == current:
        raise InvalidInput("choose a new password: this is the current one", code=Code.PASSWORD_UNCHANGED)
    new_hash = await hash_password(new)
    async with db.session(write=True) as session:
        row = await session.get(Account, account_id)
        assert row is not None
        row.password_hash = new_hash
        was_generated, row.must_change_password = row.must_change_password, False
        ended = await websessions.destroy_all_for(session, account_id, keep=keep_session)
        audit.record(
            session, actor, "user.password.change", row.login, other_sessions_ended=ended, was_generated=was_generated
        )
    if initial_password.discard(settings.data_dir, account.login):
        async with db.session(write=True) as session:
            audit.record(session, actor, "instance.password_file.remove", initial_password.PASSWORD_FILE)


async def set_password(
    session: AsyncSession,
    actor: Actor,
    login: str,
    password: str,
    *,
    keep_session: str | None = None,
    generated: bool = False,
) -> int:
    """An instance admin (or the operator's CLI) sets an account's password. Every session of that
    account ends (but `keep_session`: an admin resetting their own password stays signed in);
    returns how many sessions ended. Tokens keep working: they are separate credentials. A
    `generated` password must be changed at the next sign-in; a chosen one need not."""
    require(actor.principal, Action.INSTANCE_ADMIN, INSTANCE)
    validate_password(password)
    account = await require_by_login(session, login)
    if account.is_bot:
        raise InvalidInput(f"{account.login} is a bot: bots have no password", code=Code.NO_PASSWORD)
    account.password_hash = await hash_password(password)
    account.must_change_password = generated
    ended = await websessions.destroy_all_for(session, account.id, keep=keep_session)
    audit.record(
        session, actor, "user.password.reset", account.login, sessions_ended=ended, must_change_password=generated
    )
    return ended
