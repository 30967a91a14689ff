"""What notifications ask of a task (forge.notify.tasks.TaskLookup): its title and who started it.
The composition root hands this function to forge's notifier, which cannot import tasks."""

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from forge.notify.tasks import TaskPeople
from tasks.core.models import Task


async def task_people(session: AsyncSession, task_uuid: str) -> TaskPeople | None:
    row = (await session.execute(select(Task.title, Task.started_by_id).where(Task.uuid == task_uuid))).first()
    if row is None:
        return None
    return TaskPeople(title=row.title, started_by_id=row.started_by_id)
