"""Subtasks as the core knows them: the report of a subtask's end on its parent's transcript, and
a task's active children (what stopping it stops). Spawning one is the run side's
(`tasks/run/backchannel/spawn.py`); the worker, the settle step and the services share these."""

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from tasks.core.lifecycle import Lifecycle
from tasks.core.models import Task
from tasks.core.states import TaskState
from tasks.core.transcript import Pending, Subtask

ACTIVE_STATES = (TaskState.QUEUED, TaskState.RUNNING, TaskState.BLOCKED)


async def report_to_parent(life: Lifecycle, child: Task) -> None:
    """A subtask's run ended (or it was stopped): its parent's transcript says how, with its summary."""
    if child.parent_id is None:
        return
    state = str(child.state)
    how = {
        TaskState.AWAITING_REVIEW.value: "finished, awaiting review",
        TaskState.BLOCKED.value: "is waiting for a person",
        TaskState.FAILED.value: f"failed ({child.failure_reason or 'error'})",
        TaskState.STOPPED.value: "was stopped",
    }.get(state, state)
    ended = Subtask(event="ended", number=child.number, text=f"subtask #{child.number} {how}", state=state,
                    summary=child.summary)  # fmt: skip
    await life.append(child.parent_id, [Pending(kind="subtask", payload=ended)])


async def active_children(session: AsyncSession, task: Task) -> list[Task]:
    """The subtasks of `task` that are queued, running or blocked (what stopping it stops)."""
    states = list(ACTIVE_STATES)
    stmt = select(Task).where(Task.parent_id == task.id, Task.state.in_(states)).order_by(Task.number)
    return list((await session.execute(stmt)).scalars())
