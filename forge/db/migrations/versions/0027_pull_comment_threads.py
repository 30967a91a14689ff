"""line comments of pull requests form threads: replies, and a thread marked resolved

Revision ID: 0027
Revises: 0026
Create Date: 2026-12-05 15:00:00
"""
from collections.abc import Sequence

import sqlalchemy as sa

import forge.db.engine
from alembic import op

revision: str = '0027'
down_revision: str | None = '0026'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('pull_comments', schema=None) as batch_op:
        batch_op.add_column(sa.Column('in_reply_to_id', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('resolved_at', forge.db.engine.UTCDateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column('resolved_by_id', sa.Integer(), nullable=True))
        batch_op.create_foreign_key(
            'fk_pull_comments_in_reply_to_id', 'pull_comments', ['in_reply_to_id'], ['id'], ondelete='CASCADE'
        )
        batch_op.create_foreign_key(
            'fk_pull_comments_resolved_by_id', 'accounts', ['resolved_by_id'], ['id'], ondelete='SET NULL'
        )


def downgrade() -> None:
    with op.batch_alter_table('pull_comments', schema=None) as batch_op:
        batch_op.drop_constraint('fk_pull_comments_resolved_by_id', type_='foreignkey')
        batch_op.drop_constraint('fk_pull_comments_in_reply_to_id', type_='foreignkey')
        batch_op.drop_column('resolved_by_id')
        batch_op.drop_column('resolved_at')
        batch_op.drop_column('in_reply_to_id')
