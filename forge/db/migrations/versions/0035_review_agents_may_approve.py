"""a repository's task settings say whether an agent asked to review a pull request may approve it

Revision ID: 0035
Revises: 0034
Create Date: 2026-12-05 17:10:00
"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0035'
down_revision: str | None = '0034'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('repo_task_settings', schema=None) as batch_op:
        batch_op.add_column(sa.Column('review_agents_may_approve', sa.Boolean(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('repo_task_settings', schema=None) as batch_op:
        batch_op.drop_column('review_agents_may_approve')
