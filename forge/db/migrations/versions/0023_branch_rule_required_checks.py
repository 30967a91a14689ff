"""branch rules name the status contexts a head needs before it merges (required_checks)

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-05 12:30:00
"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0023'
down_revision: str | None = '0022'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Existing rules require no check (null): merges go on as before.
    with op.batch_alter_table('branch_rules', schema=None) as batch_op:
        batch_op.add_column(sa.Column('required_checks', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('branch_rules', schema=None) as batch_op:
        batch_op.drop_column('required_checks')
