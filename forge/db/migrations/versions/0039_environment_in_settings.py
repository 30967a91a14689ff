"""task settings: an environment declared in the repository's settings (its environment.yml text)

Revision ID: 0039
Revises: 0038
Create Date: 2026-12-05 21:05:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op


revision: str = "0039"
down_revision: str | None = "0038"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("repo_task_settings", schema=None) as batch_op:
        batch_op.add_column(sa.Column("environment_yml", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("repo_task_settings", schema=None) as batch_op:
        batch_op.drop_column("environment_yml")
