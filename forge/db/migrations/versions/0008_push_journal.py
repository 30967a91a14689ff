"""push journal: a push record names the journal entry it settles (exactly once)

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01 09:30:00
"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0008'
down_revision: str | None = '0007'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('pushes', schema=None) as batch_op:
        batch_op.add_column(sa.Column('journal_id', sa.String(length=36), nullable=True))
        batch_op.create_unique_constraint(batch_op.f('uq_pushes_journal_id'), ['journal_id'])


def downgrade() -> None:
    with op.batch_alter_table('pushes', schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f('uq_pushes_journal_id'), type_='unique')
        batch_op.drop_column('journal_id')
