"""the model and webhook allow-lists an instance admin keeps (beside the operator's variables)

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-05 05:00:00
"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import forge.db.engine

revision: str = '0019'
down_revision: str | None = '0018'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('allowed_hosts',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('list_name', sa.String(length=16), nullable=False),
    sa.Column('host', sa.String(length=255), nullable=False),
    sa.Column('note', sa.String(length=200), nullable=False),
    sa.Column('created_by_id', sa.Integer(), nullable=True),
    sa.Column('created_at', forge.db.engine.UTCDateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['created_by_id'], ['accounts.id'], name=op.f('fk_allowed_hosts_created_by_id_accounts'), ondelete='SET NULL'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_allowed_hosts')),
    sa.UniqueConstraint('list_name', 'host', name='uq_allowed_hosts_list_host')
    )


def downgrade() -> None:
    op.drop_table('allowed_hosts')
