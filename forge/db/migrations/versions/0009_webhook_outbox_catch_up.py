"""webhook outbox: catch-up marker of a recovery

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01 10:05:00.000000
"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0009'
down_revision: str | None = '0008'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('webhook_outbox', schema=None) as batch_op:
        batch_op.add_column(sa.Column('caught_up_at_attempt', sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('webhook_outbox', schema=None) as batch_op:
        batch_op.drop_column('caught_up_at_attempt')
