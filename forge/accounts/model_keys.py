"""Personal model keys ("model access"): a person's own provider keys, encrypted at rest with
their own SecretBox purpose, write-only (reads say whether one is set and its last four
characters at most). Tasks spend one only where the repository allows personal keys
(tasks/core/repo_settings.py `model_access`), and only towards the person's own base URL or the
instance's. A key may name the model its runs use (with a base URL of the person's own, the
instance's or repository's model may not exist there)."""

from datetime import datetime
from typing import Annotated, Literal
from urllib.parse import urlsplit

import msgspec
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from forge.core.access import AccountRef, Action, require
from forge.core.addresses import AllowList, ask_admin, host_refusal, is_noncanonical_ipv4
from forge.core.error_codes import Code
from forge.core.errors import InvalidInput, NotFound
from forge.core.security import SecretBox
from forge.core.settings import Settings
from forge.db import allowlists, audit
from forge.db.audit import Actor
from forge.db.models import Account, ModelKey

PROVIDERS = ("anthropic", "openai")
KEY_PURPOSE = "forgehand-personal-model-keys-v1"
ProviderName = Literal["anthropic", "openai"]


class ModelKeyRead(msgspec.Struct, kw_only=True):
    provider: str
    configured: bool
    last4: str | None = None  # the key's last four characters (none for short keys)
    base_url: str | None = None
    model: str | None = None  # the model runs ask for with this key (null: the repository's or instance's)
    updated_at: datetime | None = None


class ModelKeyPut(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    api_key: Annotated[str, msgspec.Meta(max_length=4096)]
    base_url: Annotated[str, msgspec.Meta(max_length=500)] | None = None
    model: Annotated[str, msgspec.Meta(max_length=200)] | None = None


class PersonalKey(msgspec.Struct, frozen=True, kw_only=True):
    api_key: str
    base_url: str
    model: str = ""


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
        provider=provider,
        configured=True,
        last4=row.last4 or None,
        base_url=row.base_url,
        model=row.model,
        updated_at=row.updated_at,
    )


def check_endpoint_url(url: str) -> str:
    """A model endpoint as a person or a repository admin may set it: http(s), a host, and nothing the
    gateway would not send as given (no userinfo, query or fragment: with `#` a URL would choose the
    whole upstream path, `/v1/messages` dropped). Returns it unchanged; "" stays ""."""
    if not url:
        return url
    bad = "\x00" in url or any(c.isspace() for c in url)
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (a bad port raises)
    except ValueError:
        bad = True
    else:
        bad = bad or parts.scheme not in {"http", "https"} or not parts.hostname
        bad = bad or "@" in parts.netloc or bool(parts.query) or bool(parts.fragment) or "?" in url or "#" in url
    if bad:
        raise InvalidInput(
            "the model endpoint is an http(s) URL with a host, without credentials, query or fragment",
            code=Code.INVALID_MODEL_URL,
        )
    return url


def instance_endpoint(settings: Settings, provider: str) -> str:
    """The instance's own endpoint of a provider (the operator's choice: never checked)."""
    return settings.anthropic_base_url if provider == "anthropic" else settings.model_base_url


def check_endpoint_host(url: str, allow: AllowList, instance: str) -> str:
    """The address rules of a model endpoint, as the gateway applies them when it connects: a
    loopback name or a literal address that is not public is refused unless the model allow-list
    names it (names that resolve to such an address can only be refused when connecting). The
    instance's own endpoint is exempt. Returns `url`; "" stays ""."""
    if not url or url.rstrip("/") == instance.rstrip("/"):
        return url
    host = urlsplit(url).hostname or ""
    if is_noncanonical_ipv4(host):
        raise InvalidInput(
            f"{host!r} is a non-canonical IPv4 spelling; write the address as a dotted quad",
            code=Code.INVALID_MODEL_URL,
        )
    refused = host_refusal(host, allow)
    if refused is not None:
        raise InvalidInput(
            f"{url} cannot be a model endpoint: {refused}; {ask_admin(host, 'model endpoints')}",
            code=Code.HOST_NOT_ALLOWED,
        )
    return url


async def check_endpoint(session: AsyncSession, settings: Settings, provider: str, url: str) -> str:
    """A model endpoint as saved: its shape (`check_endpoint_url`) and its host (the allow-list
    as it is now)."""
    check_endpoint_url(url)
    if not url:
        return url
    allow = await allowlists.current(session, settings, "model")
    return check_endpoint_host(url, allow, instance_endpoint(settings, provider))


def check_model_name(model: str) -> str:
    """A model name as a person types it: printable, without spaces (`claude-sonnet-4-5`)."""
    if model and (not model.isprintable() or any(c.isspace() for c in model)):
        raise InvalidInput(
            "a model name is printable characters without spaces (e.g. claude-sonnet-4-5)",
            code=Code.INVALID_MODEL_NAME,
        )
    return model


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
    # Session only, like tokens: a leaked token must not point its owner's key at another endpoint.
    require(actor.principal, Action.ACCOUNT_MANAGE, AccountRef(account.id, account.owner_id))
    name = require_provider(provider)
    key = change.api_key.strip()
    if len(key) < 8 or not key.isprintable() or any(c.isspace() for c in key):
        raise InvalidInput("a model key is 8-4096 printable characters without spaces", code=Code.INVALID_MODEL_KEY)
    base_url = await check_endpoint(session, settings, name, (change.base_url or "").strip()) or None
    model = check_model_name((change.model or "").strip()) or None
    row = (await _rows(session, account.id)).get(name)
    if row is None:
        row = ModelKey(account_id=account.id, provider=name, api_key_enc="", last4="")
        session.add(row)
    row.api_key_enc = _box(settings).encrypt(key)
    row.last4 = key[-4:] if len(key) >= 16 else ""
    row.base_url = base_url
    row.model = model
    await session.flush()
    audit.record(
        session, actor, "user.model_key.set", account.login, provider=name, base_url=base_url or "", model=model or ""
    )
    return _read(name, row)


async def remove(session: AsyncSession, actor: Actor, account: Account, provider: str) -> ModelKeyRead:
    require(actor.principal, Action.ACCOUNT_MANAGE, AccountRef(account.id, account.owner_id))
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
        p: PersonalKey(api_key=box.decrypt(r.api_key_enc), base_url=r.base_url or "", model=r.model or "")
        for p, r in (await _rows(session, account_id)).items()
    }
