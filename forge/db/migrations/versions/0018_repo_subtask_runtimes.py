"""a repository may let subtasks run on other runtimes than their parent's (spawn_subtask)

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-01 19:20:00
"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0018'
down_revision: str | None = '0017'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('repo_task_settings', schema=None) as batch_op:
        batch_op.add_column(sa.Column('subtask_runtimes', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('repo_task_settings', schema=None) as batch_op:
        batch_op.drop_column('subtask_runtimes')
