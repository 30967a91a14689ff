"""The environment images an instance admin registers (docs/environments.md, "Images"): local images
an environment may start from besides the built-in ones and the operator's
FORGEHAND_ENVIRONMENT_EXTRA_IMAGES. Instance admins only; each change audited."""

import re
from datetime import datetime
from typing import Annotated

import msgspec
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from forge.core.access import INSTANCE, Action, require
from forge.core.errors import Conflict, InvalidInput, NotFound
from forge.core.text import require_no_nul
from forge.db import audit
from forge.db.audit import Actor
from forge.db.models import Account
from tasks.core.environment_images import allowed_images as allowed_images
from tasks.core.environment_images import registered
from tasks.core.models import EnvironmentImage

# repository[:tag] as Docker names local images: lower-case path components, an optional tag.
REFERENCE = re.compile(
    r"^[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?$"
)
MAX_IMAGES = 100


class EnvironmentImageRead(msgspec.Struct, kw_only=True):
    id: int
    reference: str
    note: str
    added_by: str | None
    added_at: datetime


class EnvironmentImageCreate(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    reference: Annotated[str, msgspec.Meta(min_length=1, max_length=255)]
    note: Annotated[str, msgspec.Meta(max_length=200)] = ""


async def list_images(session: AsyncSession, actor: Actor) -> list[EnvironmentImageRead]:
    require(actor.principal, Action.INSTANCE_ADMIN, INSTANCE)
    rows = (await session.execute(select(EnvironmentImage).order_by(EnvironmentImage.id))).scalars().all()
    logins = {a.id: a.login for a in (await session.scalars(select(Account))).all()} if rows else {}
    return [
        EnvironmentImageRead(
            id=r.id,
            reference=r.reference,
            note=r.note,
            added_by=logins.get(r.created_by_id) if r.created_by_id else None,
            added_at=r.created_at,
        )
        for r in rows
    ]


async def register(session: AsyncSession, actor: Actor, data: EnvironmentImageCreate) -> EnvironmentImageRead:
    """Register a local image (422 `invalid_environment_image` for a bad reference, 409 when it is
    registered already)."""
    require(actor.principal, Action.INSTANCE_ADMIN, INSTANCE)
    note = require_no_nul(data.note, "the note").strip()  # PostgreSQL stores no NUL in text
    reference = data.reference.strip()
    if not REFERENCE.match(reference):
        raise InvalidInput(
            f"{reference[:80]!r} is not a local image reference (repository[:tag], lower case)",
            code="invalid_environment_image",
        )
    if len(await registered(session)) >= MAX_IMAGES:
        raise InvalidInput(f"at most {MAX_IMAGES} images may be registered", code="invalid_environment_image")
    row = EnvironmentImage(reference=reference, note=note, created_by_id=actor.principal.account_id)
    session.add(row)
    try:
        async with session.begin_nested():
            await session.flush()
    except IntegrityError:
        raise Conflict(f"{reference} is registered already", code="conflict") from None
    audit.record(session, actor, "instance.environment_image.add", reference)
    return EnvironmentImageRead(
        id=row.id, reference=row.reference, note=row.note, added_by=actor.principal.login, added_at=row.created_at
    )


async def unregister(session: AsyncSession, actor: Actor, image_id: int) -> None:
    require(actor.principal, Action.INSTANCE_ADMIN, INSTANCE)
    row = await session.get(EnvironmentImage, image_id)
    if row is None:
        raise NotFound("no registered environment image has this id", code="not_found")
    await session.delete(row)
    audit.record(session, actor, "instance.environment_image.remove", row.reference)
