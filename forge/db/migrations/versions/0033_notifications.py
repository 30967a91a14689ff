"""notifications: the inbox, watching, per-person settings and the e-mail outbox

Revision ID: 0033
Revises: 0032
Create Date: 2026-12-05 17:00:00
"""
from collections.abc import Sequence

revision: str = '0033'
down_revision: str | None = '0032'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
