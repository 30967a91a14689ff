"""Admin > Workers: every task worker seen in the last day, with its Docker engine, labels,
capacity, runs and state (claiming, engine unreachable, lost, stopped), from the same service as
`GET /api/v1/admin/workers`. Read-only: a worker is started and stopped on its host."""

from typing import Any

from litestar import Controller, Request, get
from litestar.response import Template

from forge.http.deps import ActorDep, DbSession, SettingsDep
from forge.http.pages.common import instance_admin, page
from tasks.services import workers


class WorkerPages(Controller):
    path = "/admin/workers"
    include_in_schema = False
    guards = [instance_admin]

    @get("/")
    async def workers_page(
        self, request: Request[Any, Any, Any], db_session: DbSession, actor: ActorDep, settings: SettingsDep
    ) -> Template:
        rows = await workers.list_workers(db_session, actor, settings)
        return page(request, "tasks/admin_workers.html", workers=rows, lease=settings.worker_lease_seconds)
