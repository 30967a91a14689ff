"""tasks already in review with changes become pull requests (their branch into their base), as
tasks that reach review from now on do

Revision ID: 0031
Revises: 0030
Create Date: 2026-12-05 16:20:00
"""

from collections.abc import Sequence
from datetime import UTC, datetime

import sqlalchemy as sa

import forge.db.engine
from alembic import op

revision: str = "0031"
down_revision: str | None = "0030"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_AT = forge.db.engine.UTCDateTime(timezone=True)
_TASKS = sa.table(
    'tasks',
    sa.column('id', sa.Integer), sa.column('repo_id', sa.Integer), sa.column('number', sa.Integer),
    sa.column('title', sa.String), sa.column('summary', sa.Text), sa.column('base', sa.String),
    sa.column('branch', sa.String), sa.column('base_sha', sa.String), sa.column('head_sha', sa.String),
    sa.column('head_is_wip', sa.Boolean), sa.column('state', sa.String), sa.column('agent_id', sa.Integer),
    sa.column('result_pull_number', sa.Integer),
)  # fmt: skip
_PULLS = sa.table(
    'pull_requests',
    sa.column('repo_id', sa.Integer), sa.column('number', sa.Integer), sa.column('title', sa.String),
    sa.column('body', sa.Text), sa.column('head_ref', sa.String), sa.column('base_ref', sa.String),
    sa.column('head_sha', sa.String), sa.column('base_sha', sa.String), sa.column('state', sa.String),
    sa.column('draft', sa.Boolean), sa.column('author_id', sa.Integer), sa.column('head_pushed_by_id', sa.Integer),
    sa.column('created_at', _AT), sa.column('updated_at', _AT),
)  # fmt: skip
_COUNTERS = sa.table("issue_counters", sa.column("repo_id", sa.Integer), sa.column("last_number", sa.Integer))


def _next_number(bind: sa.Connection, repo_id: int) -> int:
    last = bind.execute(sa.select(_COUNTERS.c.last_number).where(_COUNTERS.c.repo_id == repo_id)).scalar()
    if last is None:
        bind.execute(_COUNTERS.insert().values(repo_id=repo_id, last_number=1))
        return 1
    bind.execute(_COUNTERS.update().where(_COUNTERS.c.repo_id == repo_id).values(last_number=last + 1))
    return int(last) + 1


def upgrade() -> None:
    bind = op.get_bind()
    waiting = bind.execute(
        sa.select(_TASKS)
        .where(
            _TASKS.c.state == "awaiting_review",
            _TASKS.c.result_pull_number.is_(None),
            _TASKS.c.head_sha != "",
            _TASKS.c.head_sha != _TASKS.c.base_sha,
            _TASKS.c.head_is_wip.is_(False),
        )
        .order_by(_TASKS.c.id)
    ).all()
    now = datetime.now(UTC)
    for task in waiting:
        taken = bind.execute(
            sa.select(sa.func.count())
            .select_from(_PULLS)
            .where(
                _PULLS.c.repo_id == task.repo_id,
                _PULLS.c.head_ref == task.branch,
                _PULLS.c.base_ref == task.base,
                _PULLS.c.state == "open",
            )
        ).scalar_one()
        if taken:
            continue
        number = _next_number(bind, task.repo_id)
        summary = f"{task.summary.strip()}\n\n" if (task.summary or "").strip() else ""
        bind.execute(
            _PULLS.insert().values(
                repo_id=task.repo_id,
                number=number,
                title=" ".join(task.title.split())[:256] or task.branch,
                body=f"{summary}The work of task #{task.number}.\n",
                head_ref=task.branch,
                base_ref=task.base,
                head_sha=task.head_sha,
                base_sha=task.base_sha,
                state="open",
                draft=False,
                author_id=task.agent_id,
                head_pushed_by_id=task.agent_id,
                created_at=now,
                updated_at=now,
            )  # fmt: skip
        )
        bind.execute(_TASKS.update().where(_TASKS.c.id == task.id).values(result_pull_number=number))


def downgrade() -> None:
    # The pull requests stay: they are rows like any other from here on.
    pass
