"""Loading a repository for webhook administration: the host's shared loader and access rule
(`forge.repositories.load` + `forge.access.require`), kept behind this one function."""

from sqlalchemy.ext.asyncio import AsyncSession

from forge import repositories
from forge.access import Action, Principal
from forge.models import Repository


async def repo_for_hooks_admin(session: AsyncSession, principal: Principal, owner: str, name: str) -> Repository:
    """The repository, if `principal` may manage its webhooks (404 below read access, else 403)."""
    resource = await repositories.load(session, principal, owner, name, Action.WEBHOOKS_ADMIN)
    return resource.repo
