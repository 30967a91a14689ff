"""What notifications need to know of a task, asked of whoever composes the app: forge does not
import the tasks package, so `forge.app.factory` hands in an implementation (tasks.services)."""

from typing import Protocol

import msgspec
from sqlalchemy.ext.asyncio import AsyncSession


class TaskPeople(msgspec.Struct, frozen=True, kw_only=True):
    """A task as its notification names it: its title and who started it (None: nobody now)."""

    title: str
    started_by_id: int | None


class TaskLookup(Protocol):
    """Who started task `task_uuid`, and its title; None when there is no such task."""

    async def __call__(self, session: AsyncSession, task_uuid: str) -> TaskPeople | None: ...


async def no_tasks(session: AsyncSession, task_uuid: str) -> TaskPeople | None:
    """The lookup of an app composed without tasks: task events notify nobody."""
    return None
