"""environment images an instance admin registered (local images an environment may start from)

Revision ID: 0041
Revises: 0040
Create Date: 2026-12-05 21:40:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import forge.db.engine


revision: str = "0041"
down_revision: str | None = "0040"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "environment_images",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("reference", sa.String(length=255), nullable=False),
        sa.Column("note", sa.String(length=200), nullable=False),
        sa.Column("created_by_id", sa.Integer(), nullable=True),
        sa.Column("created_at", forge.db.engine.UTCDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["created_by_id"], ["accounts.id"], name=op.f("fk_environment_images_created_by_id_accounts"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_environment_images")),
        sa.UniqueConstraint("reference", name="uq_environment_images_reference"),
    )


def downgrade() -> None:
    op.drop_table("environment_images")
