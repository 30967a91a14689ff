"""Personal model keys ("model access"): a person's own provider keys, encrypted at rest with
their own SecretBox purpose, write-only (reads say whether one is set and its last four
characters at most). Tasks spend one only where the repository allows personal keys
(tasks/core/repo_settings.py `model_access`), and only towards the person's own base URL or the
instance's."""

from datetime import datetime
from typing import Annotated, Literal
from urllib.parse import urlsplit

import msgspec
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from forge import audit
from forge.audit import Actor
from forge.error_codes import Code
from forge.errors import InvalidInput, NotFound
from forge.models import Account, ModelKey
from forge.security import SecretBox
from forge.settings import Settings

PROVIDERS = ("anthropic", "openai")
KEY_PURPOSE = "forgehand-personal-model-keys-v1"
ProviderName = Literal["anthropic", "openai"]


class ModelKeyRead(msgspec.Struct, kw_only=True):
    provider: str
    configured: bool
    last4: str | None = None  # the key's last four characters (none for short keys)
    base_url: str | None = None
    updated_at: datetime | None = None


class ModelKeyPut(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    api_key: Annotated[str, msgspec.Meta(max_length=4096)]
    base_url: Annotated[str, msgspec.Meta(max_length=500)] | None = None


class PersonalKey(msgspec.Struct, frozen=True, kw_only=True):
    api_key: str
    base_url: str


def _box(settings: Settings) -> SecretBox:
    return SecretBox(settings.secret_key, purpose=KEY_PURPOSE)


def require_provider(provider: str) -> ProviderName:
    if provider not in PROVIDERS:
        raise NotFound(f"no model provider {provider!r} (anthropic, openai)", code=Code.UNKNOWN_MODEL_PROVIDER)
    return provider  # type: ignore[return-value]


def _read(provider: str, row: ModelKey | None) -> ModelKeyRead:
    if row is None:
        return ModelKeyRead(provider=provider, configured=False)
    return ModelKeyRead(
        provider=provider, configured=True, last4=row.last4 or None, base_url=row.base_url, updated_at=row.updated_at
    )


async def _rows(session: AsyncSession, account_id: int) -> dict[str, ModelKey]:
    rows = (await session.execute(select(ModelKey).where(ModelKey.account_id == account_id))).scalars().all()
    return {r.provider: r for r in rows}


async def list_for(session: AsyncSession, account: Account) -> list[ModelKeyRead]:
    rows = await _rows(session, account.id)
    return [_read(p, rows.get(p)) for p in PROVIDERS]


async def get(session: AsyncSession, account: Account, provider: str) -> ModelKeyRead:
    name = require_provider(provider)
    return _read(name, (await _rows(session, account.id)).get(name))


async def put(
    session: AsyncSession, settings: Settings, actor: Actor, account: Account, provider: str, change: ModelKeyPut
) -> ModelKeyRead:
    name = require_provider(provider)
    key = change.api_key.strip()
    if len(key) < 8 or not key.isprintable() or any(c.isspace() for c in key):
        raise InvalidInput("a model key is 8-4096 printable characters without spaces", code=Code.INVALID_MODEL_KEY)
    base_url = (change.base_url or "").strip() or None
    if base_url is not None:
        parts = urlsplit(base_url)
        if parts.scheme not in {"http", "https"} or not parts.hostname or parts.username or "\x00" in base_url:
            raise InvalidInput("the model endpoint is an http(s) URL", code=Code.INVALID_MODEL_URL)
    row = (await _rows(session, account.id)).get(name)
    if row is None:
        row = ModelKey(account_id=account.id, provider=name, api_key_enc="", last4="")
        session.add(row)
    row.api_key_enc = _box(settings).encrypt(key)
    row.last4 = key[-4:] if len(key) >= 16 else ""
    row.base_url = base_url
    await session.flush()
    audit.record(session, actor, "user.model_key.set", account.login, provider=name, base_url=base_url or "")
    return _read(name, row)


async def remove(session: AsyncSession, actor: Actor, account: Account, provider: str) -> ModelKeyRead:
    name = require_provider(provider)
    row = (await _rows(session, account.id)).get(name)
    if row is None:
        raise NotFound(f"no personal {name} key is set", code=Code.MODEL_KEY_NOT_FOUND)
    await session.delete(row)
    await session.flush()
    audit.record(session, actor, "user.model_key.delete", account.login, provider=name)
    return _read(name, None)


async def personal_keys(session: AsyncSession, settings: Settings, account_id: int | None) -> dict[str, PersonalKey]:
    """An account's keys, decrypted, for the run that spends them (never for a response)."""
    if account_id is None:
        return {}
    box = _box(settings)
    return {
        p: PersonalKey(api_key=box.decrypt(r.api_key_enc), base_url=r.base_url or "")
        for p, r in (await _rows(session, account_id)).items()
    }
