"""pull requests remember who last moved their head: that person's approval does not count

Revision ID: 0030
Revises: 0029
Create Date: 2026-12-05 16:00:00
"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0030'
down_revision: str | None = '0029'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('pull_requests', schema=None) as batch_op:
        batch_op.add_column(sa.Column('head_pushed_by_id', sa.Integer(), nullable=True))
        batch_op.create_foreign_key(
            'fk_pull_requests_head_pushed_by_id', 'accounts', ['head_pushed_by_id'], ['id'], ondelete='SET NULL'
        )


def downgrade() -> None:
    with op.batch_alter_table('pull_requests', schema=None) as batch_op:
        batch_op.drop_constraint('fk_pull_requests_head_pushed_by_id', type_='foreignkey')
        batch_op.drop_column('head_pushed_by_id')
