"""A person's notification settings: where each reason goes (`off`, `web`: the inbox, `email`: the
inbox and an e-mail) and the address e-mail goes to. Without a row every reason goes to the inbox."""

import re
from datetime import datetime

import msgspec
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from forge.core.error_codes import Code
from forge.core.errors import InvalidInput, about_field
from forge.db import audit
from forge.db.audit import Actor
from forge.db.notify_models import NotificationSetting
from forge.notify.reasons import CHANNELS, REASONS, Channel

# What the settings accept as an address (the SMTP server judges the rest): one @, no spaces or
# angle brackets, a dot in the domain.
_EMAIL = re.compile(r"[^@\s<>,;\"]{1,64}@[^@\s<>,;\"]+\.[^@\s<>,;\"]+")


class NotificationSettings(msgspec.Struct, kw_only=True):
    email: str
    channels: dict[str, Channel]  # every reason, with its channel
    updated_at: datetime | None = None


def _full(channels: dict[str, str]) -> dict[str, Channel]:
    return {reason: channels.get(reason, "web") for reason in REASONS}  # type: ignore[misc]


async def _row(session: AsyncSession, account_id: int) -> NotificationSetting | None:
    return await session.get(NotificationSetting, account_id)


async def get(session: AsyncSession, account_id: int) -> NotificationSettings:
    row = await _row(session, account_id)
    if row is None:
        return NotificationSettings(email="", channels=_full({}))
    return NotificationSettings(email=row.email, channels=_full(row.channels), updated_at=row.updated_at)


async def of_accounts(session: AsyncSession, account_ids: list[int]) -> dict[int, NotificationSettings]:
    """The settings of these accounts (the default for those without a row)."""
    found = {
        row.account_id: NotificationSettings(email=row.email, channels=_full(row.channels))
        for row in (
            await session.execute(select(NotificationSetting).where(NotificationSetting.account_id.in_(account_ids)))
        ).scalars()
    }
    return {a: found.get(a) or NotificationSettings(email="", channels=_full({})) for a in account_ids}


def check(email: str, channels: dict[str, str]) -> tuple[str, dict[str, Channel]]:
    """The settings as they will be stored; refusals name the field."""
    email = email.strip()
    with about_field("email"):
        if email and (len(email) > 254 or not _EMAIL.fullmatch(email)):
            raise InvalidInput(
                f"{email[:60]!r} is not an e-mail address: write it as name@example.org",
                code=Code.INVALID_NOTIFICATION_SETTINGS,
            )
    for reason, channel in channels.items():
        with about_field(reason):
            if reason not in REASONS or channel not in CHANNELS:
                raise InvalidInput(
                    f"{reason}: {channel!r} is not a channel of a reason; reasons are {', '.join(REASONS)}, "
                    f"each off, web or email",
                    code=Code.INVALID_NOTIFICATION_SETTINGS,
                )
    if not email and "email" in channels.values():
        with about_field("email"):
            raise InvalidInput(
                "e-mail needs an address: fill in the e-mail address, or send those reasons to the web only",
                code=Code.INVALID_NOTIFICATION_SETTINGS,
            )
    return email, _full(channels)


async def save(
    session: AsyncSession, actor: Actor, account_id: int, email: str, channels: dict[str, str]
) -> NotificationSettings:
    """Store the person's settings (audited; the address is not written into the audit log)."""
    email, full = check(email, channels)
    row = await _row(session, account_id)
    if row is None:
        row = NotificationSetting(account_id=account_id)
        session.add(row)
    row.email = email
    row.channels = dict(full)
    audit.record(
        session, actor, "notifications.settings", actor.principal.login, email_set=bool(email),
        email_reasons=sorted(r for r, c in full.items() if c == "email"),
        off=sorted(r for r, c in full.items() if c == "off"),
    )  # fmt: skip
    await session.flush()
    return NotificationSettings(email=row.email, channels=full, updated_at=row.updated_at)


async def set_channel(session: AsyncSession, account_id: int, reason: str, channel: Channel) -> None:
    """One reason's channel (the e-mail's unsubscribe link turns a reason's e-mail off)."""
    row = await _row(session, account_id)
    if row is None:
        row = NotificationSetting(account_id=account_id, email="", channels={})
        session.add(row)
    row.channels = {**row.channels, reason: channel}
    await session.flush()
