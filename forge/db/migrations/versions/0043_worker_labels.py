"""worker labels: the labels a task requires of the worker that claims its runs, and those every
task of a repository requires (its task settings)

Revision ID: 0043
Revises: 0042
Create Date: 2026-12-06 10:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op


revision: str = "0043"
down_revision: str | None = "0042"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("tasks", sa.Column("required_labels", sa.JSON(), server_default=sa.text("'[]'"), nullable=False))
    op.add_column("repo_task_settings", sa.Column("worker_labels", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("repo_task_settings", schema=None) as batch_op:
        batch_op.drop_column("worker_labels")
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.drop_column("required_labels")
