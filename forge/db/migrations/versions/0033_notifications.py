"""notifications: the inbox, watching, per-person settings and the e-mail outbox

Revision ID: 0033
Revises: 0032
Create Date: 2026-12-05 17:00:00
"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import forge.db.engine

revision: str = '0033'
down_revision: str | None = '0032'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('mail_outbox',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('account_id', sa.Integer(), nullable=True),
    sa.Column('to_addr', sa.String(length=254), nullable=False),
    sa.Column('subject', sa.String(length=300), nullable=False),
    sa.Column('body', sa.Text(), nullable=False),
    sa.Column('message_id', sa.String(length=300), nullable=False),
    sa.Column('thread_id', sa.String(length=300), nullable=False),
    sa.Column('unsubscribe_url', sa.String(length=2000), nullable=False),
    sa.Column('state', sa.String(length=8), nullable=False),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('next_attempt_at', forge.db.engine.UTCDateTime(timezone=True), nullable=False),
    sa.Column('lease_until', forge.db.engine.UTCDateTime(timezone=True), nullable=True),
    sa.Column('claim_token', sa.String(length=32), nullable=True),
    sa.Column('last_error', sa.String(length=500), nullable=False),
    sa.Column('created_at', forge.db.engine.UTCDateTime(timezone=True), nullable=False),
    sa.Column('sent_at', forge.db.engine.UTCDateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['account_id'], ['accounts.id'], name=op.f('fk_mail_outbox_account_id_accounts'), ondelete='SET NULL'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_mail_outbox'))
    )
    with op.batch_alter_table('mail_outbox', schema=None) as batch_op:
        batch_op.create_index('ix_mail_outbox_due', ['state', 'next_attempt_at'], unique=False)

    op.create_table('notification_settings',
    sa.Column('account_id', sa.Integer(), nullable=False),
    sa.Column('email', sa.String(length=254), nullable=False),
    sa.Column('channels', sa.JSON(), nullable=False),
    sa.Column('updated_at', forge.db.engine.UTCDateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['account_id'], ['accounts.id'], name=op.f('fk_notification_settings_account_id_accounts'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('account_id', name=op.f('pk_notification_settings'))
    )
    op.create_table('notification_threads',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('account_id', sa.Integer(), nullable=False),
    sa.Column('repo_id', sa.Integer(), nullable=False),
    sa.Column('subject_type', sa.String(length=16), nullable=False),
    sa.Column('subject_number', sa.Integer(), nullable=False),
    sa.Column('reason', sa.String(length=24), nullable=False),
    sa.Column('ignored', sa.Boolean(), nullable=False),
    sa.Column('created_at', forge.db.engine.UTCDateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['account_id'], ['accounts.id'], name=op.f('fk_notification_threads_account_id_accounts'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['repo_id'], ['repositories.id'], name=op.f('fk_notification_threads_repo_id_repositories'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_notification_threads')),
    sa.UniqueConstraint('repo_id', 'subject_type', 'subject_number', 'account_id', name='uq_notification_threads_subject_account')
    )
    with op.batch_alter_table('notification_threads', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_notification_threads_account_id'), ['account_id'], unique=False)

    op.create_table('notifications',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('account_id', sa.Integer(), nullable=False),
    sa.Column('repo_id', sa.Integer(), nullable=False),
    sa.Column('subject_type', sa.String(length=16), nullable=False),
    sa.Column('subject_number', sa.Integer(), nullable=False),
    sa.Column('subject_title', sa.String(length=256), nullable=False),
    sa.Column('subject_url', sa.String(length=1000), nullable=False),
    sa.Column('reason', sa.String(length=24), nullable=False),
    sa.Column('unread', sa.Boolean(), nullable=False),
    sa.Column('done', sa.Boolean(), nullable=False),
    sa.Column('last_actor', sa.String(length=40), nullable=False),
    sa.Column('last_read_at', forge.db.engine.UTCDateTime(timezone=True), nullable=True),
    sa.Column('created_at', forge.db.engine.UTCDateTime(timezone=True), nullable=False),
    sa.Column('updated_at', forge.db.engine.UTCDateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['account_id'], ['accounts.id'], name=op.f('fk_notifications_account_id_accounts'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['repo_id'], ['repositories.id'], name=op.f('fk_notifications_repo_id_repositories'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_notifications')),
    sa.UniqueConstraint('account_id', 'repo_id', 'subject_type', 'subject_number', name='uq_notifications_account_subject')
    )
    with op.batch_alter_table('notifications', schema=None) as batch_op:
        batch_op.create_index('ix_notifications_account_updated', ['account_id', 'done', 'updated_at'], unique=False)
        batch_op.create_index(batch_op.f('ix_notifications_repo_id'), ['repo_id'], unique=False)

    op.create_table('repo_subscriptions',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('repo_id', sa.Integer(), nullable=False),
    sa.Column('account_id', sa.Integer(), nullable=False),
    sa.Column('level', sa.String(length=16), nullable=False),
    sa.Column('created_at', forge.db.engine.UTCDateTime(timezone=True), nullable=False),
    sa.Column('updated_at', forge.db.engine.UTCDateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['account_id'], ['accounts.id'], name=op.f('fk_repo_subscriptions_account_id_accounts'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['repo_id'], ['repositories.id'], name=op.f('fk_repo_subscriptions_repo_id_repositories'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_repo_subscriptions')),
    sa.UniqueConstraint('repo_id', 'account_id', name='uq_repo_subscriptions_repo_account')
    )
    with op.batch_alter_table('repo_subscriptions', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_repo_subscriptions_account_id'), ['account_id'], unique=False)



def downgrade() -> None:
    with op.batch_alter_table('repo_subscriptions', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_repo_subscriptions_account_id'))

    op.drop_table('repo_subscriptions')
    with op.batch_alter_table('notifications', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_notifications_repo_id'))
        batch_op.drop_index('ix_notifications_account_updated')

    op.drop_table('notifications')
    with op.batch_alter_table('notification_threads', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_notification_threads_account_id'))

    op.drop_table('notification_threads')
    op.drop_table('notification_settings')
    with op.batch_alter_table('mail_outbox', schema=None) as batch_op:
        batch_op.drop_index('ix_mail_outbox_due')

    op.drop_table('mail_outbox')
