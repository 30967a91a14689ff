"""repository secrets: an environment's setup-only secrets, encrypted at rest

Revision ID: 0037
Revises: 0036
Create Date: 2026-12-06 10:00:00
"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import forge.db.engine

revision: str = '0037'
down_revision: str | None = '0036'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('repo_secrets',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('repo_id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=128), nullable=False),
    sa.Column('value_encrypted', sa.Text(), nullable=False),
    sa.Column('created_at', forge.db.engine.UTCDateTime(timezone=True), nullable=False),
    sa.Column('updated_at', forge.db.engine.UTCDateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['repo_id'], ['repositories.id'], name=op.f('fk_repo_secrets_repo_id_repositories'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_repo_secrets')),
    sa.UniqueConstraint('repo_id', 'name', name='uq_repo_secrets_repo_name')
    )


def downgrade() -> None:
    op.drop_table('repo_secrets')
