"""The allow-lists of hosts that user-configured endpoints may use although the address rules
(forge.core.addresses) refuse them: `model` (model endpoints set in a repository's task settings or in
a personal key) and `webhooks` (webhook and policy endpoints).

Two sources make up each list: the operator's environment variable
(`FORGEHAND_MODEL_ALLOWED_HOSTS`, `FORGEHAND_WEBHOOKS_ALLOWED_HOSTS`), the floor, always allowed
and read-only here; and the hosts an instance admin adds in Admin > Network (or the admin API),
stored in `allowed_hosts`, audited, and in force without a restart:

- a save (a repository's task settings, a personal key, a webhook) reads the list in its own
  transaction (`current`, `with_entries`);
- a connection (the gateway's URL guard, the webhooks' outbound pool) asks an `AllowListSource`,
  which keeps the list for `CACHE_SECONDS` and reloads it at once after a change committed in
  this process (another process, such as `forgehand worker`, sees it within `CACHE_SECONDS`)."""

import time
from datetime import datetime
from typing import Annotated, Literal

import msgspec
import structlog
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from forge.core.access import INSTANCE, Action, require
from forge.core.addresses import AllowList, merged, normalize_host
from forge.core.error_codes import Code
from forge.core.errors import Conflict, InvalidInput, NotFound
from forge.core.settings import Settings
from forge.db import audit
from forge.db.audit import Actor
from forge.db.engine import Database, after_commit
from forge.db.models import Account, AllowedHost

log = structlog.get_logger("forgehand.allowlists")

ListName = Literal["model", "webhooks"]
LISTS: dict[ListName, tuple[str, str]] = {
    "model": ("model_allowed_hosts", "model endpoints"),
    "webhooks": ("webhooks_allowed_hosts", "webhooks"),
}
CACHE_SECONDS = 2.0
_generation = 0  # bumped by every committed change in this process


class AllowedHostRead(msgspec.Struct, kw_only=True):
    id: int
    host: str
    note: str
    added_by: str | None
    added_at: datetime


class AllowListRead(msgspec.Struct, kw_only=True):
    name: str  # "model" | "webhooks"
    title: str  # what the list is for, as the admin page says it
    setting: str  # the operator's variable, the floor
    floor: list[str]  # the variable's entries: always allowed, changed only in the environment
    entries: list[AllowedHostRead]  # what instance admins added


class AllowedHostCreate(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    host: Annotated[str, msgspec.Meta(min_length=1, max_length=255)]
    note: Annotated[str, msgspec.Meta(max_length=200)] = ""


def require_list(name: str) -> ListName:
    if name not in LISTS:
        raise NotFound(f"no allow-list {name!r} (model, webhooks)", code=Code.UNKNOWN_ALLOW_LIST)
    return name


def env_name(name: ListName) -> str:
    return "FORGEHAND_" + LISTS[name][0].upper()


def _floor_text(settings: Settings, name: ListName) -> str:
    return str(getattr(settings, LISTS[name][0]))


def floor(settings: Settings, name: ListName) -> AllowList:
    """The operator's list (the environment); ValueError names the variable."""
    return AllowList.parse(_floor_text(settings, name), setting=env_name(name))


async def _rows(session: AsyncSession, name: ListName) -> list[AllowedHost]:
    stmt = select(AllowedHost).where(AllowedHost.list_name == name).order_by(AllowedHost.host)
    return list((await session.execute(stmt)).scalars())


async def with_entries(session: AsyncSession, name: ListName, base: AllowList) -> AllowList:
    """`base` (the floor, or what a test allows) with the hosts instance admins added."""
    return merged(base, AllowList.parse([r.host for r in await _rows(session, name)]))


async def current(session: AsyncSession, settings: Settings, name: ListName) -> AllowList:
    """The list as it is now, for a check when something is saved."""
    return await with_entries(session, name, floor(settings, name))


async def read(session: AsyncSession, settings: Settings, name: ListName) -> AllowListRead:
    rows = await _rows(session, name)
    ids = {r.created_by_id for r in rows if r.created_by_id is not None}
    logins = (
        dict((await session.execute(select(Account.id, Account.login).where(Account.id.in_(ids)))).tuples().all())
        if ids
        else {}
    )
    return AllowListRead(
        name=name,
        title=LISTS[name][1],
        setting=env_name(name),
        floor=[item.strip() for item in _floor_text(settings, name).split(",") if item.strip()],
        entries=[
            AllowedHostRead(
                id=r.id,
                host=r.host,
                note=r.note,
                added_by=logins.get(r.created_by_id) if r.created_by_id else None,
                added_at=r.created_at,
            )
            for r in rows
        ],
    )


def _changed() -> None:
    global _generation
    _generation += 1


async def add(
    session: AsyncSession, settings: Settings, actor: Actor, name: ListName, data: AllowedHostCreate
) -> AllowedHostRead:
    require(actor.principal, Action.INSTANCE_ADMIN, INSTANCE)
    try:
        host = normalize_host(data.host)
    except ValueError as exc:
        raise InvalidInput(str(exc), code=Code.INVALID_ALLOWED_HOST) from None
    if "\x00" in data.note:
        raise InvalidInput("a note must not contain NUL characters", code=Code.INVALID_CHARACTERS)
    if any(r.host == host for r in await _rows(session, name)):
        raise Conflict(f"{host} is on the {LISTS[name][1]} allow-list already", code=Code.ALLOWED_HOST_EXISTS)
    row = AllowedHost(list_name=name, host=host, note=data.note.strip(), created_by_id=actor.principal.account_id)
    session.add(row)
    await session.flush()
    audit.record(session, actor, "admin.allowed_host.add", f"{name}:{host}", note=row.note)
    after_commit(session, "allowlists.changed", _changed)
    return AllowedHostRead(id=row.id, host=host, note=row.note, added_by=actor.principal.login, added_at=row.created_at)


async def remove(session: AsyncSession, actor: Actor, name: ListName, entry_id: int) -> None:
    require(actor.principal, Action.INSTANCE_ADMIN, INSTANCE)
    row = await session.get(AllowedHost, entry_id)
    if row is None or row.list_name != name:
        raise NotFound(f"no entry {entry_id} on the {LISTS[name][1]} allow-list", code=Code.ALLOWED_HOST_NOT_FOUND)
    host = row.host
    await session.delete(row)
    await session.flush()
    audit.record(session, actor, "admin.allowed_host.remove", f"{name}:{host}")
    after_commit(session, "allowlists.changed", _changed)


class AllowListSource:
    """One list as connections check it: `base` (the floor) with the admins' hosts, kept for
    `ttl` seconds and reloaded at once after a change committed in this process. If the
    database cannot be read, the last list read (at first `base`) stays in force."""

    def __init__(self, db: Database, name: ListName, base: AllowList, *, ttl: float = CACHE_SECONDS) -> None:
        self.db = db
        self.name = name
        self.base = base
        self.ttl = ttl
        self._list = base
        self._loaded_at: float | None = None
        self._generation = -1

    async def __call__(self) -> AllowList:
        now = time.monotonic()
        fresh = self._loaded_at is not None and now - self._loaded_at < self.ttl
        if fresh and self._generation == _generation:
            return self._list
        generation = _generation
        try:
            async with self.db.session() as session:
                self._list = await with_entries(session, self.name, self.base)
        except Exception as exc:  # a connection check must not fail on the list's storage
            log.warning("the allow-list could not be read; the last one read stays", list=self.name, error=str(exc))
        self._loaded_at, self._generation = now, generation
        return self._list
