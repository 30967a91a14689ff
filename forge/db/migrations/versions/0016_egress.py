"""egress: a repository's network access setting, and what the proxy did for each run

Revision ID: 0016
Revises: 0014
Create Date: 2026-12-01 15:40:00

Written on a branch next to 0015 (the back-channel); the integrator chains it after 0015. It
touches only `repo_task_settings` (a JSON column) and `task_runs` (two counters).
"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0016'
down_revision: str | None = '0015'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('repo_task_settings', schema=None) as batch_op:
        batch_op.add_column(sa.Column('egress', sa.JSON(), nullable=True))
    with op.batch_alter_table('task_runs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('egress_allowed', sa.Integer(), server_default='0', nullable=False))
        batch_op.add_column(sa.Column('egress_blocked', sa.Integer(), server_default='0', nullable=False))


def downgrade() -> None:
    with op.batch_alter_table('task_runs', schema=None) as batch_op:
        batch_op.drop_column('egress_blocked')
        batch_op.drop_column('egress_allowed')
    with op.batch_alter_table('repo_task_settings', schema=None) as batch_op:
        batch_op.drop_column('egress')
