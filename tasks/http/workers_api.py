"""REST for the workers' register (docs/operator.md, "Workers")."""

from litestar import Controller, get

from forge.http.auth import signed_in
from forge.http.deps import ActorDep, DbSession, SettingsDep
from tasks.core.worker_registry import WorkerView
from tasks.services import workers


class WorkerController(Controller):
    guards = [signed_in]
    path = "/api/v1/admin/workers"
    tags = ["admin"]

    @get("/", summary="The task workers: their engine, labels, capacity, runs and state (instance admins)")
    async def list_workers(self, db_session: DbSession, actor: ActorDep, settings: SettingsDep) -> list[WorkerView]:
        return await workers.list_workers(db_session, actor, settings)
