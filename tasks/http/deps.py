"""Path-parameter dependencies of the task routes (REST and pages alike), like gitea's
`RepoAssignment`: `{owner}/{name}` becomes the repository with the caller's access (404 below the
role that reads tasks) and `{number}` the task, loaded once per request in a read-only session the
dependency holds for the request. Handlers that write open their own write transaction (after a
policy precheck outside it: `tasks.http.actions`) and re-read there with `reload`.

Nothing holds that session's pooled connection across a wait: a handler ends its read
transaction (`tasks.services.reads.release`) before a policy precheck's HTTP call, a write
transaction (which may queue for its turn), or `stop_and_wait`; a read that follows takes a
connection again. Plain reads keep theirs to the end (re-queueing on the pool per query would
only slow them). Litestar closes the session before a streamed response (SSE) starts, and the
stream takes a connection only for each read (`tasks.http.events`)."""

from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

from litestar import Request
from litestar.datastructures import State
from litestar.di import NamedDependency, Provide
from litestar.params import FromPath
from sqlalchemy.ext.asyncio import AsyncSession

from forge.core.access import Action
from forge.db.audit import Actor
from forge.http.auth import actor_of
from forge.repos import repositories
from forge.repos.repositories import RepoResource
from tasks.core.models import Task
from tasks.services.tasks import TaskService, parse_number
from tasks.system import TaskSystem

TASKS = "/api/v1/repos/{owner:str}/{name:str}/tasks"
TASK = TASKS + "/{number:str}"
REPO_TASKS = "/{owner:str}/{name:str}/tasks"


def task_system(state: State) -> TaskSystem:
    system: TaskSystem = state.tasks
    return system


@dataclass
class RepoScope:
    """A repository's tasks as the caller sees them."""

    system: TaskSystem
    actor: Actor
    owner: str
    name: str
    session: AsyncSession  # read-only, for this request
    res: RepoResource
    svc: TaskService

    async def load_repo(self, session: AsyncSession) -> tuple[RepoResource, TaskService]:
        """The repository again, in another session (a write transaction)."""
        res = await repositories.load(session, self.actor.principal, self.owner, self.name, Action.TASK_READ)
        return res, self.system.service(session)


@dataclass
class TaskScope(RepoScope):
    number: int
    task: Task

    async def reload(self, session: AsyncSession) -> tuple[RepoResource, TaskService, Task]:
        """Repository, service and task in another session (a write transaction, or a fresh read)."""
        res, svc = await self.load_repo(session)
        return res, svc, await svc.get(res, self.number)


RepoScopeDep = NamedDependency[RepoScope]
TaskScopeDep = NamedDependency[TaskScope]
SystemDep = NamedDependency[TaskSystem]


async def provide_repo_scope(
    request: Request[Any, Any, Any], state: State, owner: FromPath[str], name: FromPath[str]
) -> AsyncGenerator[RepoScope, None]:
    system = task_system(state)
    actor = actor_of(request)
    # A route may load for a stronger action (`opt={"repo_action": ...}`): below it the repository
    # is 404 or 403 exactly as `repositories.load` decides.
    action: Action = request.route_handler.opt.get("repo_action", Action.TASK_READ)
    async with system.db.session() as s:
        res = await repositories.load(s, actor.principal, owner, name, action)
        yield RepoScope(system=system, actor=actor, owner=owner, name=name, session=s, res=res, svc=system.service(s))


async def provide_task_scope(repo_scope: RepoScopeDep, number: FromPath[str]) -> TaskScope:
    n = parse_number(number)
    task = await repo_scope.svc.get(repo_scope.res, n)
    return TaskScope(
        system=repo_scope.system,
        actor=repo_scope.actor,
        owner=repo_scope.owner,
        name=repo_scope.name,
        session=repo_scope.session,
        res=repo_scope.res,
        svc=repo_scope.svc,
        number=n,
        task=task,
    )


def provide_system(state: State) -> TaskSystem:
    return task_system(state)


DEPENDENCIES = {
    "repo_scope": Provide(provide_repo_scope),
    "task_scope": Provide(provide_task_scope),
    "task_system": Provide(provide_system, sync_to_thread=False),
}
