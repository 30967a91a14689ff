"""Reading a task's subtasks (GET .../tasks/{n}/subtasks, the task page's tree). Spawning one is
the back-channel's (tasks/run/backchannel/spawn.py); stopping a parent stops its children
(`TaskService.request_stop`, with `tasks/core/subtasks.active_children`)."""

from sqlalchemy import select

from forge.repos.repositories import RepoResource
from tasks.core.models import Task
from tasks.core.schemas import TaskRead
from tasks.services.tasks import TaskService

MAX_LISTED = 200


async def children(svc: TaskService, task: Task) -> list[Task]:
    stmt = select(Task).where(Task.parent_id == task.id).order_by(Task.number).limit(MAX_LISTED)
    return list((await svc.session.execute(stmt)).scalars())


async def subtask_reads(svc: TaskService, res: RepoResource, task: Task) -> list[TaskRead]:
    """The task's subtasks, oldest first, as the task API shows them (a constant number of queries)."""
    return await svc.to_reads([(c, res) for c in await children(svc, task)])
