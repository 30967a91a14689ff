"""What waits for a person across repositories: tasks awaiting their review (the dashboard's list).
A task is theirs to review when `rules.may_review` says so (never the task's own agent), it has
changes, and they have not yet reviewed its current head."""

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from forge.core.access import Principal
from forge.db.models import Repository
from forge.repos.repositories import RepoResource, resource_for
from tasks.core.models import Review, Task
from tasks.core.states import TaskState
from tasks.services import rules
from tasks.services.reviews import DRAFT

SCAN = 500  # most recently updated tasks in review looked at


async def awaiting_review(
    session: AsyncSession, principal: Principal, limit: int = 50
) -> list[tuple[Task, RepoResource]]:
    if principal.account_id is None:
        return []
    rows = (
        await session.execute(
            select(Task, Repository)
            .join(Repository, Repository.id == Task.repo_id)
            .where(Task.state == TaskState.AWAITING_REVIEW, Task.head_sha != Task.base_sha, Task.head_sha != "")
            .order_by(Task.updated_at.desc(), Task.id.desc())
            .limit(SCAN)
        )
    ).all()
    reviewed = set(
        (
            await session.execute(
                select(Review.task_id, Review.commit_sha).where(
                    Review.author_id == principal.account_id, Review.verdict != DRAFT
                )
            )
        )
        .tuples()
        .all()
    )
    resources: dict[int, RepoResource] = {}
    out: list[tuple[Task, RepoResource]] = []
    for task, repo in rows:
        if (task.id, task.head_sha) in reviewed:
            continue
        res = resources.get(repo.id)
        if res is None:
            res = resources[repo.id] = await resource_for(session, repo, principal)
        if rules.may_read(principal, res) and rules.may_review(principal, res, task):
            out.append((task, res))
            if len(out) >= limit:
                break
    return out
