"""REST for a repository's task settings (repository admins)."""

from litestar import Controller, get, post, put
from litestar.params import FromPath, JSONBody

from forge.core.access import Action
from forge.http.deps import ActorDep, DbSession, SettingsDep
from forge.repos import repositories
from tasks.core.models import RepoTaskSettings
from tasks.services.repo_settings import (
    EnvironmentRebuild,
    RepoTaskSettingsRead,
    RepoTaskSettingsUpdate,
    rebuild_environment,
    settings_read,
    update,
)


class RepoTaskSettingsController(Controller):
    path = "/api/v1/repos/{owner:str}/{name:str}/task-settings"
    tags = ["tasks"]

    @get("/", summary="The repository's task settings (overrides of the instance's; the key is never shown)")
    async def get_settings(
        self, db_session: DbSession, actor: ActorDep, owner: FromPath[str], name: FromPath[str]
    ) -> RepoTaskSettingsRead:
        res = await repositories.load(db_session, actor.principal, owner, name, Action.REPO_ADMIN)
        return settings_read(await db_session.get(RepoTaskSettings, res.repo.id))

    @put("/", summary="Set the repository's task settings (repository admins)")
    async def put_settings(
        self,
        db_session: DbSession,
        actor: ActorDep,
        settings: SettingsDep,
        owner: FromPath[str],
        name: FromPath[str],
        data: JSONBody[RepoTaskSettingsUpdate],
    ) -> RepoTaskSettingsRead:
        res = await repositories.load(db_session, actor.principal, owner, name, Action.REPO_ADMIN)
        return await update(db_session, settings, actor, res, data)


class EnvironmentController(Controller):
    path = "/api/v1/repos/{owner:str}/{name:str}/environment"
    tags = ["tasks"]

    @post(
        "/rebuild",
        summary="Build the repository's environment again at its next task (repository admins)",
        status_code=200,
    )
    async def rebuild(
        self, db_session: DbSession, actor: ActorDep, owner: FromPath[str], name: FromPath[str]
    ) -> EnvironmentRebuild:
        res = await repositories.load(db_session, actor.principal, owner, name, Action.REPO_ADMIN)
        return await rebuild_environment(db_session, actor, res)
