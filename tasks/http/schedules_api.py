"""REST for a repository's schedules (repository admins): list, create, read, change, delete.
Thin: the repository is loaded for `repo.admin` (below it 404 or 403, as `repositories.load`
decides), the schedules service does the rest in the request's transaction."""

from litestar import Controller, delete, get, patch, post
from litestar.params import FromPath, JSONBody

from forge.core.access import Action
from forge.http.deps import ActorDep, DbSession
from forge.repos import repositories
from tasks.core.schedule_schemas import ScheduleCreate, ScheduleRead, ScheduleUpdate
from tasks.http.deps import DEPENDENCIES, SystemDep

SCHEDULES = "/api/v1/repos/{owner:str}/{name:str}/schedules"
SCHEDULE = SCHEDULES + "/{schedule_id:int}"


class ScheduleController(Controller):
    tags = ["schedules"]
    dependencies = DEPENDENCIES

    @get(SCHEDULES, summary="The repository's schedules (recurring tasks), by name")
    async def list_schedules(
        self, db_session: DbSession, actor: ActorDep, task_system: SystemDep, owner: FromPath[str], name: FromPath[str]
    ) -> list[ScheduleRead]:
        res = await repositories.load(db_session, actor.principal, owner, name, Action.REPO_ADMIN)
        schedules = task_system.schedules(db_session)
        return await schedules.reads(res, await schedules.of_repo(actor.principal, res))

    @post(SCHEDULES, summary="Create a schedule: a task started at each time of a cron expression", status_code=201)
    async def create_schedule(
        self,
        db_session: DbSession,
        actor: ActorDep,
        task_system: SystemDep,
        owner: FromPath[str],
        name: FromPath[str],
        data: JSONBody[ScheduleCreate],
    ) -> ScheduleRead:
        res = await repositories.load(db_session, actor.principal, owner, name, Action.REPO_ADMIN)
        schedules = task_system.schedules(db_session)
        [read] = await schedules.reads(res, [await schedules.create(actor, res, data)])
        return read

    @get(SCHEDULE, summary="A schedule")
    async def get_schedule(
        self,
        db_session: DbSession,
        actor: ActorDep,
        task_system: SystemDep,
        owner: FromPath[str],
        name: FromPath[str],
        schedule_id: FromPath[int],
    ) -> ScheduleRead:
        res = await repositories.load(db_session, actor.principal, owner, name, Action.REPO_ADMIN)
        schedules = task_system.schedules(db_session)
        [read] = await schedules.reads(res, [await schedules.get(actor.principal, res, schedule_id)])
        return read

    @patch(SCHEDULE, summary="Change, pause or resume a schedule (absent fields stay as they are)")
    async def update_schedule(
        self,
        db_session: DbSession,
        actor: ActorDep,
        task_system: SystemDep,
        owner: FromPath[str],
        name: FromPath[str],
        schedule_id: FromPath[int],
        data: JSONBody[ScheduleUpdate],
    ) -> ScheduleRead:
        res = await repositories.load(db_session, actor.principal, owner, name, Action.REPO_ADMIN)
        schedules = task_system.schedules(db_session)
        found = await schedules.get(actor.principal, res, schedule_id)
        [read] = await schedules.reads(res, [await schedules.update(actor, res, found, data)])
        return read

    @delete(SCHEDULE, summary="Delete a schedule (the tasks it started stay)", status_code=204)
    async def delete_schedule(
        self,
        db_session: DbSession,
        actor: ActorDep,
        task_system: SystemDep,
        owner: FromPath[str],
        name: FromPath[str],
        schedule_id: FromPath[int],
    ) -> None:
        res = await repositories.load(db_session, actor.principal, owner, name, Action.REPO_ADMIN)
        schedules = task_system.schedules(db_session)
        await schedules.delete(actor, res, await schedules.get(actor.principal, res, schedule_id))
