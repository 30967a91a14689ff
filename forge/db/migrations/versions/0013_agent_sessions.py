"""agent sessions: which agent CLI (name, version) ran each run, and the agent's session id a task resumes

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-01 12:10:00
"""
from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = '0013'
down_revision: str | None = '0012'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('task_runs') as batch:
        batch.add_column(sa.Column('agent_name', sa.String(length=64), nullable=False, server_default=''))
        batch.add_column(sa.Column('agent_version', sa.String(length=64), nullable=False, server_default=''))
    with op.batch_alter_table('tasks') as batch:
        batch.add_column(sa.Column('agent_session_id', sa.String(length=128), nullable=False, server_default=''))


def downgrade() -> None:
    with op.batch_alter_table('tasks') as batch:
        batch.drop_column('agent_session_id')
    with op.batch_alter_table('task_runs') as batch:
        batch.drop_column('agent_version')
        batch.drop_column('agent_name')
