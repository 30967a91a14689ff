"""a personal model key names the model its runs use

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-05 06:00:00
"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0020'
down_revision: str | None = '0019'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('model_keys', schema=None) as batch_op:
        batch_op.add_column(sa.Column('model', sa.String(length=200), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('model_keys', schema=None) as batch_op:
        batch_op.drop_column('model')
