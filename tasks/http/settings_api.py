"""REST for a repository's task settings (repository admins)."""

from litestar import Controller, delete, get, post, put
from litestar.params import FromPath, JSONBody

from forge.core.access import Action
from forge.http.deps import ActorDep, DbSession, SettingsDep
from forge.repos import repositories
from tasks.core.models import RepoTaskSettings
from tasks.services.repo_settings import (
    EnvironmentRead,
    EnvironmentRebuild,
    EnvironmentSet,
    RepoTaskSettingsRead,
    RepoTaskSettingsUpdate,
    environment_read,
    rebuild_environment,
    set_environment,
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

    @get("/", summary="The environment declared in the repository's settings, and its generation")
    async def get_environment(
        self, db_session: DbSession, actor: ActorDep, owner: FromPath[str], name: FromPath[str]
    ) -> EnvironmentRead:
        res = await repositories.load(db_session, actor.principal, owner, name, Action.REPO_ADMIN)
        return environment_read(await db_session.get(RepoTaskSettings, res.repo.id))

    @put("/", summary="Declare the repository's environment in its settings (in place of its file)")
    async def put_environment(
        self,
        db_session: DbSession,
        actor: ActorDep,
        settings: SettingsDep,
        owner: FromPath[str],
        name: FromPath[str],
        data: JSONBody[EnvironmentSet],
    ) -> EnvironmentRead:
        res = await repositories.load(db_session, actor.principal, owner, name, Action.REPO_ADMIN)
        return await set_environment(db_session, settings, actor, res, data.declaration)

    @delete("/", summary="Remove the environment declared in the settings (the repository's file applies again)")
    async def delete_environment(
        self, db_session: DbSession, actor: ActorDep, settings: SettingsDep, owner: FromPath[str], name: FromPath[str]
    ) -> None:
        res = await repositories.load(db_session, actor.principal, owner, name, Action.REPO_ADMIN)
        await set_environment(db_session, settings, actor, res, None)
