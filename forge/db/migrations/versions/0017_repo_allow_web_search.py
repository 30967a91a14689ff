"""a repository's tasks may let the provider search the web (OpenAI Responses' hosted web_search)

Revision ID: 0017
Revises: 0014
Create Date: 2026-12-01 15:40:00

Written next to 0015 and 0016 (other branches, also after 0014); it touches only
`repo_task_settings`, so it chains after them in any order.
"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0017'
down_revision: str | None = '0016'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('repo_task_settings', schema=None) as batch_op:
        batch_op.add_column(sa.Column('allow_web_search', sa.Boolean(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('repo_task_settings', schema=None) as batch_op:
        batch_op.drop_column('allow_web_search')
