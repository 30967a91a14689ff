"""The audit log: one row per mutating action and per refused attempt.

Successful actions are recorded in the same transaction as the change (they commit or vanish
together). Refusals are recorded in a transaction of their own, because the request that was
refused rolls back its own work."""

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any, Literal

import msgspec
from sqlalchemy import ColumnElement, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from forge.core.access import Principal
from forge.core.text import without_nul
from forge.db.engine import Database, utcnow
from forge.db.models import AuditEvent

Result = Literal["ok", "refused", "error"]


class Actor(msgspec.Struct, frozen=True, kw_only=True):
    """Who did it, from where: what every audit row records."""

    principal: Principal
    client_addr: str = ""
    request_id: str = ""

    @classmethod
    def system(cls, what: str = "forgehand") -> "Actor":
        return cls(principal=Principal(account_id=None, login=what, via="internal"))


class AuditRead(msgspec.Struct, kw_only=True):
    id: int
    at: datetime
    actor: str
    token_id: int | None
    client_addr: str
    action: str
    target: str
    result: str
    detail: dict[str, Any]


def _row(actor: Actor, action: str, target: str, result: Result, detail: dict[str, Any]) -> AuditEvent:
    p = actor.principal
    return AuditEvent(
        at=utcnow(),
        actor_id=p.account_id,
        actor_login=without_nul(p.login[:40]),
        token_id=p.token_id,
        client_addr=without_nul(actor.client_addr[:64]),
        action=action,
        # Refusals record what was attempted, which may be hostile text.
        target=without_nul(target[:300]),
        result=result,
        # bytes literals keep `\u0000` as the six characters of JSON's escape for NUL.
        detail=msgspec.json.decode(msgspec.json.encode(detail).replace(rb"\u0000", rb"\ufffd")),
        request_id=actor.request_id,
    )


def record(session: AsyncSession, actor: Actor, action: str, target: str = "", **detail: Any) -> None:
    """Record a successful mutating action inside the caller's transaction."""
    session.add(_row(actor, action, target, "ok", detail))


def record_refused(session: AsyncSession, actor: Actor, action: str, target: str = "", **detail: Any) -> None:
    """Record a refusal inside the caller's transaction (when that transaction will commit)."""
    session.add(_row(actor, action, target, "refused", detail))


async def record_attempt(session: AsyncSession, actor: Actor, action: str, target: str, **detail: Any) -> int:
    """Record an attempt as refused up front (see `settle_attempt`); returns its row id."""
    row = _row(actor, action, target, "refused", detail)
    session.add(row)
    await session.flush()
    return row.id


async def settle_attempt(session: AsyncSession, attempt_id: int | None, reason: str | None) -> None:
    """An attempt recorded up front: drop it when it succeeded, or keep it with its reason."""
    if attempt_id is None:
        return
    row = await session.get(AuditEvent, attempt_id)
    if row is None:
        return
    if reason is None:
        await session.delete(row)
    else:
        row.detail = {"reason": reason}


async def record_refusal(db: Database, actor: Actor, action: str, target: str = "", **detail: Any) -> None:
    """Record a refused attempt in its own transaction (the refused request rolls back).

    Call it only where the request holds no write transaction of its own (middleware, hooks, or
    handlers that open their write session after the check): on SQLite it would wait for that lock."""
    async with db.session(write=True) as session:
        session.add(_row(actor, action, target, "refused", detail))


def _refused(action: str, since: datetime, target: str | None, client_addr: str | None) -> list[ColumnElement[bool]]:
    """The refusals of `action` since `since`, for one target and/or one client address."""
    where = [AuditEvent.action == action, AuditEvent.result == "refused", AuditEvent.at >= since]
    if target is not None:
        where.append(AuditEvent.target == target)
    if client_addr is not None:
        where.append(AuditEvent.client_addr == client_addr)
    return where


async def count_refusals_since(
    session: AsyncSession,
    action: str,
    since: datetime,
    *,
    target: str | None = None,
    client_addr: str | None = None,
) -> int:
    stmt = select(func.count(AuditEvent.id)).where(*_refused(action, since, target, client_addr))
    return int((await session.execute(stmt)).scalar_one())


async def oldest_refusal_since(
    session: AsyncSession,
    action: str,
    since: datetime,
    *,
    target: str | None = None,
    client_addr: str | None = None,
) -> datetime | None:
    stmt = select(func.min(AuditEvent.at)).where(*_refused(action, since, target, client_addr))
    value = (await session.execute(stmt)).scalar_one()
    if value is None:
        return None
    return value if isinstance(value, datetime) else None


async def tail(session: AsyncSession, *, limit: int = 50, before_id: int | None = None) -> Sequence[AuditRead]:
    stmt = select(AuditEvent).order_by(AuditEvent.id.desc()).limit(max(1, min(limit, 500)))
    if before_id is not None:
        stmt = stmt.where(AuditEvent.id < before_id)
    rows = (await session.execute(stmt)).scalars().all()
    return [
        AuditRead(
            id=r.id,
            at=r.at,
            actor=r.actor_login or "anonymous",
            token_id=r.token_id,
            client_addr=r.client_addr,
            action=r.action,
            target=r.target,
            result=r.result,
            detail=dict(r.detail or {}),
        )
        for r in rows
    ]


def window_start(seconds: int) -> datetime:
    return utcnow() - timedelta(seconds=seconds)
