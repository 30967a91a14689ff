"""task settings: the runtime of tasks started from issues, mentions and review requests

Revision ID: 0036
Revises: 0035
Create Date: 2026-12-05 17:09:13.461759
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op


revision: str = "0036"
down_revision: str | None = "0035"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("repo_task_settings", schema=None) as batch_op:
        batch_op.add_column(sa.Column("trigger_runtime", sa.String(length=16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("repo_task_settings", schema=None) as batch_op:
        batch_op.drop_column("trigger_runtime")
