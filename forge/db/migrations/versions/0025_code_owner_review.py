"""branch rules may require a code owner's approval (CODEOWNERS) of each changed path

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-05 14:20:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0025"
down_revision: str | None = "0024"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Existing rules do not require code owners: merges go on as before.
    with op.batch_alter_table("branch_rules", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("require_code_owner_review", sa.Boolean(), server_default=sa.false(), nullable=False)
        )


def downgrade() -> None:
    with op.batch_alter_table("branch_rules", schema=None) as batch_op:
        batch_op.drop_column("require_code_owner_review")
