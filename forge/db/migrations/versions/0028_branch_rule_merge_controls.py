"""branch rules say who may merge pull requests, and whether a change request blocks the merge

Revision ID: 0028
Revises: 0027
Create Date: 2026-12-05 15:20:00
"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0028'
down_revision: str | None = '0027'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Existing rules keep their meaning: change requests block, anyone with write merges.
    with op.batch_alter_table('branch_rules', schema=None) as batch_op:
        batch_op.add_column(
            sa.Column('block_on_requested_changes', sa.Boolean(), server_default=sa.true(), nullable=False)
        )
        batch_op.add_column(sa.Column('merge_allowlist', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('branch_rules', schema=None) as batch_op:
        batch_op.drop_column('merge_allowlist')
        batch_op.drop_column('block_on_requested_changes')
