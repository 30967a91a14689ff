"""workers: the register of worker processes (their engine, labels, capacity, lease and whether
their engine answers)

Revision ID: 0044
Revises: 0043
Create Date: 2026-12-06 03:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import forge.db.engine

revision: str = "0044"
down_revision: str | None = "0043"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "workers",
        sa.Column("id", sa.String(length=200), nullable=False),
        sa.Column("host", sa.String(length=255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("engine", sa.String(length=500), nullable=False),
        sa.Column("labels", sa.JSON(), nullable=False),
        sa.Column("capacity", sa.Integer(), nullable=False),
        sa.Column("version", sa.String(length=64), nullable=False),
        sa.Column("running", sa.Integer(), nullable=False),
        sa.Column("engine_ok", sa.Boolean(), nullable=False),
        sa.Column("engine_error", sa.Text(), nullable=False),
        sa.Column("started_at", forge.db.engine.UTCDateTime(timezone=True), nullable=False),
        sa.Column("heartbeat_at", forge.db.engine.UTCDateTime(timezone=True), nullable=False),
        sa.Column("stopped_at", forge.db.engine.UTCDateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_workers")),
    )
    op.create_index(op.f("ix_workers_heartbeat_at"), "workers", ["heartbeat_at"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_workers_heartbeat_at"), table_name="workers")
    op.drop_table("workers")
