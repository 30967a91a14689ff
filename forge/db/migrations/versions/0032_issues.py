"""issues: labels, milestones, assignees, comments with their edit history, the timeline

Revision ID: 0032
Revises: 0031
Create Date: 2026-12-05 16:42:45.168896
"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import forge.db.engine

revision: str = '0032'
down_revision: str | None = '0031'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    
    op.create_table('labels',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('repo_id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=50), nullable=False),
    sa.Column('name_key', sa.String(length=50), nullable=False),
    sa.Column('color', sa.String(length=6), nullable=False),
    sa.Column('description', sa.String(length=200), nullable=False),
    sa.Column('created_at', forge.db.engine.UTCDateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['repo_id'], ['repositories.id'], name=op.f('fk_labels_repo_id_repositories'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_labels')),
    sa.UniqueConstraint('repo_id', 'name_key', name='uq_labels_repo_name')
    )
    op.create_table('milestones',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('repo_id', sa.Integer(), nullable=False),
    sa.Column('number', sa.Integer(), nullable=False),
    sa.Column('title', sa.String(length=100), nullable=False),
    sa.Column('title_key', sa.String(length=100), nullable=False),
    sa.Column('description', sa.Text(), nullable=False),
    sa.Column('due_on', forge.db.engine.UTCDateTime(timezone=True), nullable=True),
    sa.Column('state', sa.String(length=8), nullable=False),
    sa.Column('closed_at', forge.db.engine.UTCDateTime(timezone=True), nullable=True),
    sa.Column('created_at', forge.db.engine.UTCDateTime(timezone=True), nullable=False),
    sa.Column('updated_at', forge.db.engine.UTCDateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['repo_id'], ['repositories.id'], name=op.f('fk_milestones_repo_id_repositories'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_milestones')),
    sa.UniqueConstraint('repo_id', 'number', name='uq_milestones_repo_number'),
    sa.UniqueConstraint('repo_id', 'title_key', name='uq_milestones_repo_title')
    )
    op.create_table('issues',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('repo_id', sa.Integer(), nullable=False),
    sa.Column('number', sa.Integer(), nullable=False),
    sa.Column('title', sa.String(length=256), nullable=False),
    sa.Column('body', sa.Text(), nullable=False),
    sa.Column('state', sa.String(length=8), nullable=False),
    sa.Column('state_reason', sa.String(length=16), nullable=True),
    sa.Column('author_id', sa.Integer(), nullable=True),
    sa.Column('author_untrusted', sa.Boolean(), nullable=False),
    sa.Column('milestone_id', sa.Integer(), nullable=True),
    sa.Column('closed_by_id', sa.Integer(), nullable=True),
    sa.Column('closed_at', forge.db.engine.UTCDateTime(timezone=True), nullable=True),
    sa.Column('created_at', forge.db.engine.UTCDateTime(timezone=True), nullable=False),
    sa.Column('updated_at', forge.db.engine.UTCDateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['author_id'], ['accounts.id'], name=op.f('fk_issues_author_id_accounts'), ondelete='SET NULL'),
    sa.ForeignKeyConstraint(['closed_by_id'], ['accounts.id'], name=op.f('fk_issues_closed_by_id_accounts'), ondelete='SET NULL'),
    sa.ForeignKeyConstraint(['milestone_id'], ['milestones.id'], name=op.f('fk_issues_milestone_id_milestones'), ondelete='SET NULL'),
    sa.ForeignKeyConstraint(['repo_id'], ['repositories.id'], name=op.f('fk_issues_repo_id_repositories'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_issues')),
    sa.UniqueConstraint('repo_id', 'number', name='uq_issues_repo_number')
    )
    with op.batch_alter_table('issues', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_issues_milestone_id'), ['milestone_id'], unique=False)
        batch_op.create_index('ix_issues_repo_state', ['repo_id', 'state', 'number'], unique=False)

    op.create_table('issue_assignees',
    sa.Column('issue_id', sa.Integer(), nullable=False),
    sa.Column('account_id', sa.Integer(), nullable=False),
    sa.Column('assigned_by_id', sa.Integer(), nullable=True),
    sa.Column('created_at', forge.db.engine.UTCDateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['account_id'], ['accounts.id'], name=op.f('fk_issue_assignees_account_id_accounts'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['assigned_by_id'], ['accounts.id'], name=op.f('fk_issue_assignees_assigned_by_id_accounts'), ondelete='SET NULL'),
    sa.ForeignKeyConstraint(['issue_id'], ['issues.id'], name=op.f('fk_issue_assignees_issue_id_issues'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('issue_id', 'account_id', name=op.f('pk_issue_assignees'))
    )
    with op.batch_alter_table('issue_assignees', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_issue_assignees_account_id'), ['account_id'], unique=False)

    op.create_table('issue_comments',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('issue_id', sa.Integer(), nullable=False),
    sa.Column('author_id', sa.Integer(), nullable=True),
    sa.Column('body', sa.Text(), nullable=False),
    sa.Column('created_at', forge.db.engine.UTCDateTime(timezone=True), nullable=False),
    sa.Column('updated_at', forge.db.engine.UTCDateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['author_id'], ['accounts.id'], name=op.f('fk_issue_comments_author_id_accounts'), ondelete='SET NULL'),
    sa.ForeignKeyConstraint(['issue_id'], ['issues.id'], name=op.f('fk_issue_comments_issue_id_issues'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_issue_comments'))
    )
    with op.batch_alter_table('issue_comments', schema=None) as batch_op:
        batch_op.create_index('ix_issue_comments_issue', ['issue_id', 'id'], unique=False)

    op.create_table('issue_events',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('issue_id', sa.Integer(), nullable=False),
    sa.Column('actor_id', sa.Integer(), nullable=True),
    sa.Column('event', sa.String(length=32), nullable=False),
    sa.Column('data', sa.JSON(), nullable=False),
    sa.Column('created_at', forge.db.engine.UTCDateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['actor_id'], ['accounts.id'], name=op.f('fk_issue_events_actor_id_accounts'), ondelete='SET NULL'),
    sa.ForeignKeyConstraint(['issue_id'], ['issues.id'], name=op.f('fk_issue_events_issue_id_issues'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_issue_events'))
    )
    with op.batch_alter_table('issue_events', schema=None) as batch_op:
        batch_op.create_index('ix_issue_events_issue', ['issue_id', 'id'], unique=False)

    op.create_table('issue_labels',
    sa.Column('issue_id', sa.Integer(), nullable=False),
    sa.Column('label_id', sa.Integer(), nullable=False),
    sa.ForeignKeyConstraint(['issue_id'], ['issues.id'], name=op.f('fk_issue_labels_issue_id_issues'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['label_id'], ['labels.id'], name=op.f('fk_issue_labels_label_id_labels'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('issue_id', 'label_id', name=op.f('pk_issue_labels'))
    )
    with op.batch_alter_table('issue_labels', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_issue_labels_label_id'), ['label_id'], unique=False)

    op.create_table('issue_edits',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('issue_id', sa.Integer(), nullable=False),
    sa.Column('comment_id', sa.Integer(), nullable=True),
    sa.Column('title_before', sa.String(length=256), nullable=True),
    sa.Column('body_before', sa.Text(), nullable=True),
    sa.Column('editor_id', sa.Integer(), nullable=True),
    sa.Column('created_at', forge.db.engine.UTCDateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['comment_id'], ['issue_comments.id'], name=op.f('fk_issue_edits_comment_id_issue_comments'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['editor_id'], ['accounts.id'], name=op.f('fk_issue_edits_editor_id_accounts'), ondelete='SET NULL'),
    sa.ForeignKeyConstraint(['issue_id'], ['issues.id'], name=op.f('fk_issue_edits_issue_id_issues'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_issue_edits'))
    )
    with op.batch_alter_table('issue_edits', schema=None) as batch_op:
        batch_op.create_index('ix_issue_edits_issue', ['issue_id', 'comment_id', 'id'], unique=False)

    # A plain ADD COLUMN: a batch operation would copy the table, and on SQLite dropping the old
    # repositories table deletes every row that refers to it (tasks, pull requests, ...).
    op.add_column(
        'repositories',
        sa.Column('untrusted_issues_to_agents', sa.Boolean(), server_default=sa.false(), nullable=False),
    )

    


def downgrade() -> None:
    
    with op.batch_alter_table('repositories', schema=None) as batch_op:
        batch_op.drop_column('untrusted_issues_to_agents')

    with op.batch_alter_table('issue_edits', schema=None) as batch_op:
        batch_op.drop_index('ix_issue_edits_issue')

    op.drop_table('issue_edits')
    with op.batch_alter_table('issue_labels', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_issue_labels_label_id'))

    op.drop_table('issue_labels')
    with op.batch_alter_table('issue_events', schema=None) as batch_op:
        batch_op.drop_index('ix_issue_events_issue')

    op.drop_table('issue_events')
    with op.batch_alter_table('issue_comments', schema=None) as batch_op:
        batch_op.drop_index('ix_issue_comments_issue')

    op.drop_table('issue_comments')
    with op.batch_alter_table('issue_assignees', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_issue_assignees_account_id'))

    op.drop_table('issue_assignees')
    with op.batch_alter_table('issues', schema=None) as batch_op:
        batch_op.drop_index('ix_issues_repo_state')
        batch_op.drop_index(batch_op.f('ix_issues_milestone_id'))

    op.drop_table('issues')
    op.drop_table('milestones')
    op.drop_table('labels')
    
