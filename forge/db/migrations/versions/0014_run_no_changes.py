"""a run records that it changed nothing (no commit, no task branch created or moved)

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-01 12:10:00

After 0013 (the migrations of the model gateway and agent sessions); it touches only `task_runs`.
"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0014'
down_revision: str | None = '0013'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('task_runs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('no_changes', sa.Boolean(), server_default=sa.false(), nullable=False))


def downgrade() -> None:
    with op.batch_alter_table('task_runs', schema=None) as batch_op:
        batch_op.drop_column('no_changes')
