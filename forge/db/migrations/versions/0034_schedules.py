"""schedules, and what started a task (its trigger)

Revision ID: 0034
Revises: 0033
Create Date: 2026-12-05 17:00:00
"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import forge.db.engine

revision: str = '0034'
down_revision: str | None = '0033'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('tasks', schema=None) as batch_op:
        batch_op.add_column(sa.Column('trigger', sa.JSON(), nullable=True))

    op.create_table('task_schedules',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('repo_id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=100), nullable=False),
    sa.Column('cron', sa.String(length=100), nullable=False),
    sa.Column('timezone', sa.String(length=64), nullable=False),
    sa.Column('goal', sa.Text(), nullable=False),
    sa.Column('title', sa.String(length=200), nullable=False),
    sa.Column('agent_id', sa.Integer(), nullable=False),
    sa.Column('runtime', sa.String(length=32), nullable=False),
    sa.Column('command', sa.JSON(), nullable=True),
    sa.Column('agent_command', sa.String(length=40), nullable=True),
    sa.Column('base', sa.String(length=255), nullable=False),
    sa.Column('paused', sa.Boolean(), nullable=False),
    sa.Column('starter_id', sa.Integer(), nullable=True),
    sa.Column('next_run_at', forge.db.engine.UTCDateTime(timezone=True), nullable=False),
    sa.Column('last_run_at', forge.db.engine.UTCDateTime(timezone=True), nullable=True),
    sa.Column('last_task_id', sa.Integer(), nullable=True),
    sa.Column('last_skip_reason', sa.Text(), nullable=False),
    sa.Column('created_at', forge.db.engine.UTCDateTime(timezone=True), nullable=False),
    sa.Column('updated_at', forge.db.engine.UTCDateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['agent_id'], ['accounts.id'], name=op.f('fk_task_schedules_agent_id_accounts'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['last_task_id'], ['tasks.id'], name=op.f('fk_task_schedules_last_task_id_tasks'), ondelete='SET NULL'),
    sa.ForeignKeyConstraint(['repo_id'], ['repositories.id'], name=op.f('fk_task_schedules_repo_id_repositories'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['starter_id'], ['accounts.id'], name=op.f('fk_task_schedules_starter_id_accounts'), ondelete='SET NULL'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_task_schedules')),
    sa.UniqueConstraint('repo_id', 'name', name='uq_task_schedules_repo_name')
    )
    with op.batch_alter_table('task_schedules', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_task_schedules_agent_id'), ['agent_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_task_schedules_repo_id'), ['repo_id'], unique=False)
        batch_op.create_index('ix_task_schedules_due', ['paused', 'next_run_at'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('task_schedules', schema=None) as batch_op:
        batch_op.drop_index('ix_task_schedules_due')
        batch_op.drop_index(batch_op.f('ix_task_schedules_repo_id'))
        batch_op.drop_index(batch_op.f('ix_task_schedules_agent_id'))

    op.drop_table('task_schedules')
    with op.batch_alter_table('tasks', schema=None) as batch_op:
        batch_op.drop_column('trigger')
