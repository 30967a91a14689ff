"""a run's refused paths in a table of their own; a count and a sample on the run

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01 10:25:00

Numbered after the migrations other branches add (0008, 0009): when they are merged, its
`down_revision` becomes the last of them (the migration touches only `task_runs` and its own table).
"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0010'
down_revision: str | None = '0009'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SAMPLE = 20


def upgrade() -> None:
    op.create_table('task_run_skipped',
    sa.Column('run_id', sa.Integer(), nullable=False),
    sa.Column('idx', sa.Integer(), nullable=False),
    sa.Column('path', sa.Text(), nullable=False),
    sa.Column('reason', sa.Text(), nullable=False),
    sa.ForeignKeyConstraint(['run_id'], ['task_runs.id'], name=op.f('fk_task_run_skipped_run_id_task_runs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('run_id', 'idx', name=op.f('pk_task_run_skipped'))
    )
    with op.batch_alter_table('task_runs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('skipped_count', sa.Integer(), server_default='0', nullable=False))

    # Existing runs: every stored path becomes a row, the run keeps its count and the sample.
    bind = op.get_bind()
    runs = sa.table('task_runs', sa.column('id', sa.Integer()), sa.column('skipped', sa.JSON()),
                    sa.column('skipped_count', sa.Integer()))
    rows = sa.table('task_run_skipped', sa.column('run_id', sa.Integer()), sa.column('idx', sa.Integer()),
                    sa.column('path', sa.Text()), sa.column('reason', sa.Text()))
    for run_id, skipped in bind.execute(sa.select(runs.c.id, runs.c.skipped)).all():
        entries = [e for e in (skipped or []) if isinstance(e, dict)]
        if not entries:
            continue
        bind.execute(rows.insert(), [
            {'run_id': run_id, 'idx': i, 'path': str(e.get('path', '')), 'reason': str(e.get('reason', ''))}
            for i, e in enumerate(entries)
        ])
        bind.execute(runs.update().where(runs.c.id == run_id)
                     .values(skipped=entries[:SAMPLE], skipped_count=len(entries)))


def downgrade() -> None:
    with op.batch_alter_table('task_runs', schema=None) as batch_op:
        batch_op.drop_column('skipped_count')
    op.drop_table('task_run_skipped')
