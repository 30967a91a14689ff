"""schedules, and what started a task (its trigger)

Revision ID: 0034
Revises: 0033
Create Date: 2026-12-05 17:00:00
"""
from collections.abc import Sequence

revision: str = '0034'
down_revision: str | None = '0033'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
