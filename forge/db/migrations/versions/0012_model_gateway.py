"""the model gateway: metered usage, cost and the paying key on each run; the Anthropic provider
and personal keys on a repository's task settings; people's own model keys

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-01 12:10:00
"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import forge.db.engine

revision: str = '0012'
down_revision: str | None = '0011'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('task_runs', schema=None) as batch_op:
        for name in ('input_tokens', 'output_tokens', 'cache_read_tokens', 'cache_write_tokens'):
            batch_op.add_column(sa.Column(name, sa.Integer(), server_default='0', nullable=False))
        batch_op.add_column(sa.Column('cost_micros', sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column('model_key', sa.String(length=16), server_default='', nullable=False))
        batch_op.add_column(sa.Column('model_provider', sa.String(length=16), server_default='', nullable=False))
    with op.batch_alter_table('repo_task_settings', schema=None) as batch_op:
        batch_op.add_column(sa.Column('anthropic_base_url', sa.String(length=500), nullable=True))
        batch_op.add_column(sa.Column('anthropic_model', sa.String(length=200), nullable=True))
        batch_op.add_column(sa.Column('anthropic_api_key_enc', sa.Text(), nullable=True))
        batch_op.add_column(sa.Column('allow_personal_keys', sa.Boolean(), server_default=sa.false(), nullable=False))
    op.create_table('model_keys',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('account_id', sa.Integer(), nullable=False),
    sa.Column('provider', sa.String(length=16), nullable=False),
    sa.Column('api_key_enc', sa.Text(), nullable=False),
    sa.Column('last4', sa.String(length=4), nullable=False),
    sa.Column('base_url', sa.String(length=500), nullable=True),
    sa.Column('updated_at', forge.db.engine.UTCDateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['account_id'], ['accounts.id'], name=op.f('fk_model_keys_account_id_accounts'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_model_keys')),
    sa.UniqueConstraint('account_id', 'provider', name='uq_model_keys_account_provider')
    )


def downgrade() -> None:
    op.drop_table('model_keys')
    with op.batch_alter_table('repo_task_settings', schema=None) as batch_op:
        for name in ('allow_personal_keys', 'anthropic_api_key_enc', 'anthropic_model', 'anthropic_base_url'):
            batch_op.drop_column(name)
    with op.batch_alter_table('task_runs', schema=None) as batch_op:
        for name in ('model_provider', 'model_key', 'cost_micros', 'cache_write_tokens', 'cache_read_tokens',
                     'output_tokens', 'input_tokens'):
            batch_op.drop_column(name)
