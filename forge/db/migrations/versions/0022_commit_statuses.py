"""commit statuses (GitHub's and Gitea's shape): every report kept, the latest per context combined

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-05 12:00:00
"""
from collections.abc import Sequence

import sqlalchemy as sa

import forge.db.engine
from alembic import op

revision: str = '0022'
down_revision: str | None = '0021'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        'commit_statuses',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('repo_id', sa.Integer(), nullable=False),
        sa.Column('sha', sa.String(length=64), nullable=False),
        sa.Column('state', sa.String(length=16), nullable=False),
        sa.Column('context', sa.String(length=255), nullable=False),
        sa.Column('description', sa.String(length=1024), nullable=False),
        sa.Column('target_url', sa.String(length=2048), nullable=False),
        sa.Column('creator_id', sa.Integer(), nullable=True),
        sa.Column('created_at', forge.db.engine.UTCDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(['creator_id'], ['accounts.id'], ondelete='SET NULL'),
        sa.ForeignKeyConstraint(['repo_id'], ['repositories.id'], ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('id'),
    )
    op.create_index('ix_commit_statuses_repo_sha', 'commit_statuses', ['repo_id', 'sha', 'id'], unique=False)


def downgrade() -> None:
    op.drop_index('ix_commit_statuses_repo_sha', table_name='commit_statuses')
    op.drop_table('commit_statuses')
