"""the agent back-channel and subtasks: a question's options, the summary a run reported, a
subtask's depth and token budget, and the repository's subtask limits

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-01 15:40:00

`tasks.parent_id` and `tasks.summary` exist since 0004; this adds the index the subtask reads need.
"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0015'
down_revision: str | None = '0014'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('tasks') as batch:
        batch.add_column(sa.Column('question_options', sa.JSON(), nullable=True))
        batch.add_column(sa.Column('depth', sa.Integer(), nullable=False, server_default='0'))
        batch.add_column(sa.Column('token_budget', sa.Integer(), nullable=True))
        batch.create_index('ix_tasks_parent_id', ['parent_id'])
    with op.batch_alter_table('task_runs') as batch:
        batch.add_column(sa.Column('summary', sa.Text(), nullable=False, server_default=''))
        batch.add_column(sa.Column('summary_reported', sa.Boolean(), nullable=False, server_default=sa.false()))
    with op.batch_alter_table('repo_task_settings') as batch:
        batch.add_column(sa.Column('max_subtask_depth', sa.Integer(), nullable=True))
        batch.add_column(sa.Column('max_subtasks', sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('repo_task_settings') as batch:
        batch.drop_column('max_subtasks')
        batch.drop_column('max_subtask_depth')
    with op.batch_alter_table('task_runs') as batch:
        batch.drop_column('summary_reported')
        batch.drop_column('summary')
    with op.batch_alter_table('tasks') as batch:
        batch.drop_index('ix_tasks_parent_id')
        batch.drop_column('token_budget')
        batch.drop_column('depth')
        batch.drop_column('question_options')
