"""task settings: the generation of the repository's environment (a forced rebuild counts it up)

Revision ID: 0038
Revises: 0037
Create Date: 2026-12-05 20:50:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op


revision: str = "0038"
down_revision: str | None = "0037"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("repo_task_settings", schema=None) as batch_op:
        batch_op.add_column(sa.Column("environment_generation", sa.Integer(), server_default="0", nullable=False))


def downgrade() -> None:
    with op.batch_alter_table("repo_task_settings", schema=None) as batch_op:
        batch_op.drop_column("environment_generation")
