"""Repositories, the database side: the loaded resource the access rule sees (`RepoResource`),
finding and loading one (`load`: find, then `forge.core.access.require`, so one rule decides web,
REST and git smart HTTP), listing, the API shape (`RepoRead`), branch rules as the push rules
read them, and pushes. The use cases live beside this module: `forge.repos.lifecycle` (create,
import, settings, delete), `forge.repos.collaborators`, `forge.repos.branch_rules`. The bare
repositories on disk are the git layer, `forge.git`."""

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

import msgspec
from sqlalchemy import func, or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from forge.core.access import (
    INSTANCE,
    REPO_NOT_FOUND,
    Action,
    Principal,
    Role,
    Visibility,
    can,
    effective_role,
    require,
)
from forge.core.error_codes import Code
from forge.core.errors import NotFound
from forge.core.text import NUL
from forge.db.models import Account, BranchRule, Collaborator, Repository

RoleName = Literal["read", "write", "admin"]
VisibilityName = Literal["private", "internal", "public"]


@dataclass
class RepoResource:
    """A repository as the access rule sees it, with the roles of the accounts that were loaded."""

    repo: Repository
    roles: dict[int, Role] = field(default_factory=dict)

    @property
    def owner_id(self) -> int:
        return self.repo.owner_id

    @property
    def visibility(self) -> str:
        return self.repo.visibility

    @property
    def archived(self) -> bool:
        return self.repo.archived

    def role_of(self, account_id: int) -> Role | None:
        return self.roles.get(account_id)

    @property
    def full_name(self) -> str:
        return f"{self.repo.owner.login}/{self.repo.name}"

    @property
    def key(self) -> tuple[str, str]:
        """The on-disk name for the git store."""
        return (self.repo.owner.login.lower(), self.repo.name.lower())


class RepoRead(msgspec.Struct, kw_only=True):
    id: int
    owner: str
    name: str
    full_name: str
    description: str
    visibility: VisibilityName
    default_branch: str
    archived: bool
    # Whether an issue opened by someone without write access may be handed to an agent.
    untrusted_issues_to_agents: bool
    clone_url: str
    html_url: str
    created_at: datetime
    updated_at: datetime
    # The caller's effective role (null when anonymous read of a public repository).
    permission: RoleName | None = None


def to_read(res: RepoResource, principal: Principal, base_url: str) -> RepoRead:
    repo = res.repo
    role = effective_role(principal, res)
    full = res.full_name
    return RepoRead(
        id=repo.id,
        owner=repo.owner.login,
        name=repo.name,
        full_name=full,
        description=repo.description,
        visibility=repo.visibility,  # type: ignore[arg-type]
        default_branch=repo.default_branch,
        archived=repo.archived,
        untrusted_issues_to_agents=repo.untrusted_issues_to_agents,
        clone_url=f"{base_url}/{full}.git",
        html_url=f"{base_url}/{full}",
        created_at=repo.created_at,
        updated_at=repo.updated_at,
        permission=role.name.lower() if role is not None else None,  # type: ignore[arg-type]
    )


async def find(session: AsyncSession, owner: str, name: str) -> Repository | None:
    if NUL in owner or NUL in name or len(owner) > 100 or len(name) > 100:
        return None
    stmt = (
        select(Repository)
        .join(Account, Account.id == Repository.owner_id)
        .where(Account.login_key == owner.lower(), Repository.name_key == name.lower())
    )
    return (await session.execute(stmt)).scalar_one_or_none()


async def resource_for(session: AsyncSession, repo: Repository, principal: Principal) -> RepoResource:
    roles: dict[int, Role] = {}
    if principal.account_id is not None:
        row = (
            await session.execute(
                select(Collaborator.role).where(
                    Collaborator.repo_id == repo.id, Collaborator.account_id == principal.account_id
                )
            )
        ).scalar_one_or_none()
        if row is not None:
            roles[principal.account_id] = Role[row.upper()]
    return RepoResource(repo=repo, roles=roles)


async def load(
    session: AsyncSession, principal: Principal, owner: str, name: str, action: Action = Action.REPO_READ
) -> RepoResource:
    """Find `owner/name` and check `action`; below read access the answer is 404."""
    repo = await find(session, owner, name)
    if repo is None:
        raise NotFound(REPO_NOT_FOUND, code=Code.REPO_NOT_FOUND, refused=True)
    res = await resource_for(session, repo, principal)
    require(principal, action, res)
    return res


async def resource_roles(session: AsyncSession, res: RepoResource, account_ids: list[int]) -> dict[int, Role]:
    """The role each of these accounts has on the repository now (left out: none): owner and
    instance admins are admins, then explicit collaborators, then what the visibility gives."""
    if not account_ids:
        return {}
    rows = (
        await session.execute(
            select(Account.id, Account.is_admin, Collaborator.role)
            .outerjoin(Collaborator, (Collaborator.account_id == Account.id) & (Collaborator.repo_id == res.repo.id))
            .where(Account.id.in_(account_ids), Account.disabled.is_(False))
        )
    ).all()
    roles: dict[int, Role] = {}
    for account_id, is_admin, role in rows:
        if is_admin or account_id == res.repo.owner_id:
            roles[account_id] = Role.ADMIN
        elif role is not None:
            roles[account_id] = Role[role.upper()]
        elif res.repo.visibility in (Visibility.PUBLIC, Visibility.INTERNAL):
            roles[account_id] = Role.READ
    return roles


async def branch_rules(session: AsyncSession, repo: Repository) -> Sequence[BranchRule]:
    return (
        (await session.execute(select(BranchRule).where(BranchRule.repo_id == repo.id).order_by(BranchRule.id)))
        .scalars()
        .all()
    )


async def list_visible(session: AsyncSession, principal: Principal, *, owner: str | None = None) -> list[RepoResource]:
    """Repositories the principal can read, by name."""
    stmt = (
        select(Repository)
        .join(Account, Account.id == Repository.owner_id)
        .order_by(Account.login_key, Repository.name_key)
    )
    if owner is not None:
        stmt = stmt.where(Account.login_key == owner.lower())
    if not can(principal, Action.INSTANCE_ADMIN, INSTANCE):
        # Narrow in SQL to what could be readable; `can` below still decides each row.
        readable = [Repository.visibility == Visibility.PUBLIC]
        if principal.account_id is not None:
            readable += [
                Repository.visibility == Visibility.INTERNAL,
                Repository.owner_id == principal.account_id,
                Repository.id.in_(select(Collaborator.repo_id).where(Collaborator.account_id == principal.account_id)),
            ]
        stmt = stmt.where(or_(*readable))
    repos = (await session.execute(stmt)).scalars().all()
    roles: dict[int, Role] = {}
    if principal.account_id is not None:
        rows = await session.execute(
            select(Collaborator.repo_id, Collaborator.role).where(Collaborator.account_id == principal.account_id)
        )
        roles = {repo_id: Role[role.upper()] for repo_id, role in rows}
    out = []
    for repo in repos:
        res = RepoResource(repo=repo)
        if principal.account_id is not None and repo.id in roles:
            res.roles[principal.account_id] = roles[repo.id]
        if can(principal, Action.REPO_READ, res):
            out.append(res)
    return out


async def count(session: AsyncSession) -> int:
    return int((await session.execute(select(func.count(Repository.id)))).scalar_one())
