"""Loading a repository for an access decision. Kept in one place so that the host's shared
loader can replace it later without touching the routes."""

from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from forge.access import Action, Principal, Role, require
from forge.errors import NotFound
from forge.models import Account, Collaborator, Repository

_ROLES = {"read": Role.READ, "write": Role.WRITE, "admin": Role.ADMIN}


@dataclass(frozen=True)
class RepoResource:
    """A repository as `forge.access.RepoLike`, with the asking account's collaborator role."""

    repo: Repository
    account_id: int | None
    collaborator_role: Role | None

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
        return self.collaborator_role if account_id == self.account_id else None


async def load_repo_resource(session: AsyncSession, principal: Principal, owner: str, name: str) -> RepoResource:
    stmt = (
        select(Repository)
        .join(Account, Account.id == Repository.owner_id)
        .where(Account.login_key == owner.lower(), Repository.name_key == name.lower())
    )
    repo = (await session.execute(stmt)).scalar_one_or_none()
    if repo is None:
        raise NotFound("repository not found")
    role = None
    if principal.account_id is not None:
        value = (
            await session.execute(
                select(Collaborator.role).where(
                    Collaborator.repo_id == repo.id, Collaborator.account_id == principal.account_id
                )
            )
        ).scalar_one_or_none()
        role = _ROLES.get(value or "")
    return RepoResource(repo=repo, account_id=principal.account_id, collaborator_role=role)


async def repo_for_hooks_admin(session: AsyncSession, principal: Principal, owner: str, name: str) -> Repository:
    """The repository, if `principal` may manage its webhooks (404 below read access, else 403)."""
    resource = await load_repo_resource(session, principal, owner, name)
    require(principal, Action.WEBHOOKS_ADMIN, resource)
    return resource.repo
