"""Repository secrets: the setup-only secrets a repository's environment uses (a package index
token, a private mirror token), in GitHub's names and shapes (its Actions secrets API).

Repository admins list, set and delete them (`Action.REPO_ADMIN`); a value is write-only: nothing
here returns one except `values`, which the run that builds an environment calls. Values are
encrypted at rest with a `SecretBox` derived from the instance secret key (`Settings.secret_key`),
the key material of personal model keys, with a purpose of its own (`secret_box`). Every put
and delete is audited with the secret's name, never its value. docs/repositories.md, "Secrets"."""

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import msgspec
from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from forge.core.access import Action, require
from forge.core.error_codes import Code
from forge.core.errors import Conflict, InvalidInput, NotFound
from forge.core.security import SecretBox
from forge.core.settings import Settings
from forge.core.text import NUL
from forge.db import audit
from forge.db.audit import Actor
from forge.db.engine import utcnow
from forge.db.secret_models import RepoSecret
from forge.repos.repositories import RepoResource

SECRETS_PURPOSE = "forgehand-repo-secrets-v1"
NAME_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
RESERVED_PREFIXES = ("FORGEHAND_", "GITHUB_")
MAX_VALUE_BYTES = 48 * 1024  # GitHub's 48 KB limit, in UTF-8 bytes
MAX_SECRETS = 100


class SecretRead(msgspec.Struct, kw_only=True):
    """A secret as any response shows it: never its value."""

    name: str
    created_at: datetime
    updated_at: datetime


class SecretList(msgspec.Struct, kw_only=True):
    total_count: int
    secrets: list[SecretRead]


def secret_box(settings: Settings) -> SecretBox:
    """The box repository secrets are sealed with: the instance secret key (as for personal model
    keys), HKDF-derived for this purpose."""
    return SecretBox(settings.secret_key, purpose=SECRETS_PURPOSE)


def check_name(name: str) -> str:
    """A secret's name as GitHub allows it; refused naming the rule it breaks."""
    if not NAME_PATTERN.fullmatch(name):
        raise InvalidInput(
            f"secret name {name[:60]!r}: a name is a letter or '_' then up to 127 letters, digits or '_'",
            code=Code.INVALID_SECRET_NAME,
            field="name",
        )
    upper = name.upper()
    for prefix in RESERVED_PREFIXES:
        if upper.startswith(prefix):
            raise InvalidInput(
                f"secret name {name!r}: a name may not start with {prefix} (reserved, in any case)",
                code=Code.INVALID_SECRET_NAME,
                field="name",
            )
    return name


def check_value(value: str) -> str:
    if not value or NUL in value:
        raise InvalidInput(
            "a secret's value is at least one character, without NUL", code=Code.INVALID_SECRET_VALUE, field="value"
        )
    size = len(value.encode())
    if size > MAX_VALUE_BYTES:
        raise InvalidInput(
            f"a secret's value is at most {MAX_VALUE_BYTES} bytes (48 KiB, UTF-8); this one is {size}",
            code=Code.SECRET_TOO_LARGE,
            field="value",
        )
    return value


def _read(row: RepoSecret) -> SecretRead:
    return SecretRead(name=row.name, created_at=row.created_at, updated_at=row.updated_at)


@dataclass
class RepoSecrets:
    """The secrets of the request's (or the run's) transaction; `box` is `secret_box(settings)`."""

    session: AsyncSession
    box: SecretBox

    async def _find(self, repo_id: int, name: str) -> RepoSecret | None:
        stmt = select(RepoSecret).where(RepoSecret.repo_id == repo_id, RepoSecret.name == name)
        return (await self.session.execute(stmt)).scalar_one_or_none()

    async def list(self, res: RepoResource) -> SecretList:
        """Names and dates, by name (the caller has loaded `res` for `Action.REPO_ADMIN`)."""
        stmt = select(RepoSecret).where(RepoSecret.repo_id == res.repo.id).order_by(RepoSecret.name)
        rows = [_read(r) for r in (await self.session.execute(stmt)).scalars()]
        return SecretList(total_count=len(rows), secrets=rows)

    async def get(self, res: RepoResource, name: str) -> SecretRead:
        row = await self._find(res.repo.id, name) if NAME_PATTERN.fullmatch(name) else None
        if row is None:
            raise NotFound(f"{res.full_name} has no secret {name[:60]!r}", code=Code.SECRET_NOT_FOUND)
        return _read(row)

    async def put(self, actor: Actor, res: RepoResource, name: str, value: str) -> bool:
        """Create or replace a secret; True when it was created (201), False when replaced (204)."""
        require(actor.principal, Action.REPO_ADMIN, res)
        check_name(name)
        check_value(value)
        sealed = self.box.encrypt(value)
        row = await self._find(res.repo.id, name)
        created = row is None
        if row is None:
            count = select(func.count(RepoSecret.id)).where(RepoSecret.repo_id == res.repo.id)
            if int((await self.session.execute(count)).scalar_one()) >= MAX_SECRETS:
                raise InvalidInput(
                    f"{res.full_name} holds {MAX_SECRETS} secrets, the most a repository may: delete one first",
                    code=Code.TOO_MANY_SECRETS,
                )
            row = RepoSecret(repo_id=res.repo.id, name=name, value_encrypted=sealed)
            try:
                async with self.session.begin_nested():
                    self.session.add(row)
                    await self.session.flush()
            except IntegrityError:
                raise Conflict(f"secret {name!r} was created meanwhile: send it again", code=Code.CONFLICT) from None
        else:
            row.value_encrypted = sealed
            row.updated_at = utcnow()
            await self.session.flush()
        audit.record(self.session, actor, "repo.secret.put", res.full_name, name=name, created=created)
        return created

    async def delete(self, actor: Actor, res: RepoResource, name: str) -> None:
        require(actor.principal, Action.REPO_ADMIN, res)
        row = await self._find(res.repo.id, name) if NAME_PATTERN.fullmatch(name) else None
        if row is None:
            raise NotFound(f"{res.full_name} has no secret {name[:60]!r}", code=Code.SECRET_NOT_FOUND)
        await self.session.delete(row)
        await self.session.flush()
        audit.record(self.session, actor, "repo.secret.delete", res.full_name, name=name)

    async def values(self, res_or_repo_id: RepoResource | int, names: Sequence[str]) -> dict[str, str]:
        """The decrypted values of those of `names` the repository has (exact names; the caller
        reports the missing ones). No access check: for the run that gives a build its secrets,
        never for a response."""
        repo_id = res_or_repo_id if isinstance(res_or_repo_id, int) else res_or_repo_id.repo.id
        wanted = sorted({n for n in names if NAME_PATTERN.fullmatch(n)})
        if not wanted:
            return {}
        stmt = select(RepoSecret).where(RepoSecret.repo_id == repo_id, RepoSecret.name.in_(wanted))
        return {r.name: self.box.decrypt(r.value_encrypted) for r in (await self.session.execute(stmt)).scalars()}
