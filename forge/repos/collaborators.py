"""Who has a role on a repository besides its owner: list, add or change, remove (rows of
`Collaborator`). The owner is always `admin` and is listed first."""

from typing import Literal

import msgspec
from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncSession

from forge.accounts import accounts
from forge.core.access import Action, require
from forge.core.error_codes import Code
from forge.core.errors import InvalidInput, NotFound
from forge.db import audit
from forge.db.audit import Actor
from forge.db.models import Account, Collaborator
from forge.repos.repositories import RepoResource, RoleName


class CollaboratorRead(msgspec.Struct, kw_only=True):
    login: str
    type: Literal["User", "Bot"]
    role: RoleName


def _read(account: Account, role: RoleName) -> CollaboratorRead:
    return CollaboratorRead(login=account.login, type="Bot" if account.is_bot else "User", role=role)


async def set_collaborator(
    session: AsyncSession, actor: Actor, res: RepoResource, login: str, role: RoleName
) -> CollaboratorRead:
    require(actor.principal, Action.REPO_ADMIN, res)
    account = await accounts.require_by_login(session, login)
    if account.id == res.repo.owner_id:
        raise InvalidInput("the owner is always an admin", code=Code.OWNER_ROLE)
    if role not in ("read", "write", "admin"):
        raise InvalidInput("role is read, write or admin", code=Code.INVALID_ROLE)
    row = (
        await session.execute(
            select(Collaborator).where(Collaborator.repo_id == res.repo.id, Collaborator.account_id == account.id)
        )
    ).scalar_one_or_none()
    if row is None:
        session.add(Collaborator(repo_id=res.repo.id, account_id=account.id, role=role))
    else:
        row.role = role
    audit.record(session, actor, "repo.collaborator.set", res.full_name, login=account.login, role=role)
    return _read(account, role)


async def remove_collaborator(session: AsyncSession, actor: Actor, res: RepoResource, login: str) -> None:
    require(actor.principal, Action.REPO_ADMIN, res)
    account = await accounts.require_by_login(session, login)
    result = await session.execute(
        delete(Collaborator).where(Collaborator.repo_id == res.repo.id, Collaborator.account_id == account.id)
    )
    if not result.rowcount:  # type: ignore[attr-defined]
        raise NotFound(f"{login} is not a collaborator", code=Code.COLLABORATOR_NOT_FOUND)
    audit.record(session, actor, "repo.collaborator.remove", res.full_name, login=account.login)


async def list_collaborators(session: AsyncSession, res: RepoResource) -> list[CollaboratorRead]:
    rows = await session.execute(
        select(Collaborator, Account)
        .join(Account, Account.id == Collaborator.account_id)
        .where(Collaborator.repo_id == res.repo.id)
        .order_by(Account.login_key)
    )
    out = [_read(res.repo.owner, "admin")]
    out += [_read(account, collab.role) for collab, account in rows]
    return out
