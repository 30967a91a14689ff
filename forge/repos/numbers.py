"""The numbers of a repository's pull requests and issues: one sequence for both, as on GitHub and
Gitea (one `issue_counters` row per repository; tasks keep their own)."""

from sqlalchemy import update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession

from forge.db.models import IssueCounter


async def allocate_number(session: AsyncSession, repo_id: int) -> int:
    """The next number of the repository's pull requests and issues (the row lock serialises)."""
    dialect = session.get_bind().dialect.name
    insert_fn = postgresql.insert if dialect == "postgresql" else sqlite.insert
    await session.execute(
        insert_fn(IssueCounter)
        .values(repo_id=repo_id, last_number=0)
        .on_conflict_do_nothing(index_elements=["repo_id"])
    )
    stmt = (
        update(IssueCounter)
        .where(IssueCounter.repo_id == repo_id)
        .values(last_number=IssueCounter.last_number + 1)
        .returning(IssueCounter.last_number)
        .execution_options(synchronize_session=False)
    )
    return int((await session.execute(stmt)).scalar_one())
