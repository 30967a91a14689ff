"""merge intents: a merge is recorded before its base ref moves (crash recovery)

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01 10:15:00
"""
from collections.abc import Sequence

import sqlalchemy as sa

import forge.db.engine
from alembic import op

revision: str = '0011'
down_revision: str | None = '0010'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        'task_merge_intents',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('task_id', sa.Integer(), nullable=False),
        sa.Column('base', sa.String(length=255), nullable=False),
        sa.Column('base_sha', sa.String(length=64), nullable=False),
        sa.Column('head_sha', sa.String(length=64), nullable=False),
        sa.Column('strategy', sa.String(length=16), nullable=False),
        sa.Column('actor_id', sa.Integer(), nullable=True),
        sa.Column('owner', sa.String(length=200), nullable=False),
        sa.Column('created_at', forge.db.engine.UTCDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(['actor_id'], ['accounts.id'], name=op.f('fk_task_merge_intents_actor_id_accounts'), ondelete='SET NULL'),
        sa.ForeignKeyConstraint(['task_id'], ['tasks.id'], name=op.f('fk_task_merge_intents_task_id_tasks'), ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_task_merge_intents')),
    )
    with op.batch_alter_table('task_merge_intents', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_task_merge_intents_task_id'), ['task_id'], unique=False)


def downgrade() -> None:
    op.drop_table('task_merge_intents')
