"""pull requests, their reviews and comments, one number sequence per repository shared with
issues; branch rules that require a pull request, approvals, and dismiss stale approvals

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-05 14:10:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import forge.db.engine

revision: str = "0024"
down_revision: str | None = "0023"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_AT = forge.db.engine.UTCDateTime(timezone=True)


def _pull_requests() -> None:
    op.create_table(
        "pull_requests",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("repo_id", sa.Integer(), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("title", sa.String(length=256), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("head_ref", sa.String(length=255), nullable=False),
        sa.Column("base_ref", sa.String(length=255), nullable=False),
        sa.Column("head_sha", sa.String(length=64), nullable=False),
        sa.Column("base_sha", sa.String(length=64), nullable=False),
        sa.Column("state", sa.String(length=8), nullable=False),
        sa.Column("draft", sa.Boolean(), nullable=False),
        sa.Column("author_id", sa.Integer(), nullable=True),
        sa.Column("merged_by_id", sa.Integer(), nullable=True),
        sa.Column("merge_commit_sha", sa.String(length=64), nullable=True),
        sa.Column("merged_at", _AT, nullable=True),
        sa.Column("closed_at", _AT, nullable=True),
        sa.Column("created_at", _AT, nullable=False),
        sa.Column("updated_at", _AT, nullable=False),
        sa.ForeignKeyConstraint(["author_id"], ["accounts.id"], ondelete="SET NULL"),
        sa.ForeignKeyConstraint(["merged_by_id"], ["accounts.id"], ondelete="SET NULL"),
        sa.ForeignKeyConstraint(["repo_id"], ["repositories.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("repo_id", "number", name="uq_pull_requests_repo_number"),
    )
    op.create_index("ix_pull_requests_repo_state", "pull_requests", ["repo_id", "state", "number"], unique=False)
    op.create_index(
        "uq_pull_requests_open_head_base",
        "pull_requests",
        ["repo_id", "head_ref", "base_ref"],
        unique=True,
        sqlite_where=sa.text("state = 'open'"),
        postgresql_where=sa.text("state = 'open'"),
    )


def _reviews_and_comments() -> None:
    op.create_table(
        "pull_reviews",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("pull_id", sa.Integer(), nullable=False),
        sa.Column("author_id", sa.Integer(), nullable=True),
        sa.Column("verdict", sa.String(length=16), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("commit_sha", sa.String(length=64), nullable=False),
        sa.Column("dismissed", sa.Boolean(), nullable=False),
        sa.Column("created_at", _AT, nullable=False),
        sa.ForeignKeyConstraint(["author_id"], ["accounts.id"], ondelete="SET NULL"),
        sa.ForeignKeyConstraint(["pull_id"], ["pull_requests.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_pull_reviews_pull", "pull_reviews", ["pull_id", "id"], unique=False)
    op.create_table(
        "pull_comments",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("pull_id", sa.Integer(), nullable=False),
        sa.Column("review_id", sa.Integer(), nullable=True),
        sa.Column("author_id", sa.Integer(), nullable=True),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("path", sa.String(length=4096), nullable=True),
        sa.Column("line", sa.Integer(), nullable=True),
        sa.Column("side", sa.String(length=5), nullable=True),
        sa.Column("commit_sha", sa.String(length=64), nullable=False),
        sa.Column("created_at", _AT, nullable=False),
        sa.Column("updated_at", _AT, nullable=False),
        sa.ForeignKeyConstraint(["author_id"], ["accounts.id"], ondelete="SET NULL"),
        sa.ForeignKeyConstraint(["pull_id"], ["pull_requests.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["review_id"], ["pull_reviews.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_pull_comments_pull", "pull_comments", ["pull_id", "id"], unique=False)
    op.create_table(
        "pull_review_requests",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("pull_id", sa.Integer(), nullable=False),
        sa.Column("account_id", sa.Integer(), nullable=False),
        sa.Column("requested_by_id", sa.Integer(), nullable=True),
        sa.Column("created_at", _AT, nullable=False),
        sa.ForeignKeyConstraint(["account_id"], ["accounts.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["pull_id"], ["pull_requests.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["requested_by_id"], ["accounts.id"], ondelete="SET NULL"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("pull_id", "account_id", name="uq_pull_review_requests_pull_account"),
    )
    op.create_index("ix_pull_review_requests_pull_id", "pull_review_requests", ["pull_id"], unique=False)


def upgrade() -> None:
    op.create_table(
        "issue_counters",
        sa.Column("repo_id", sa.Integer(), nullable=False),
        sa.Column("last_number", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["repo_id"], ["repositories.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("repo_id"),
    )
    _pull_requests()
    _reviews_and_comments()
    # Existing rules keep their meaning: no pull request required, no approvals; a later push
    # dismisses stale approvals (GitHub's recommended setting, on by default here).
    with op.batch_alter_table("branch_rules", schema=None) as batch_op:
        batch_op.add_column(sa.Column("require_pull_request", sa.Boolean(), server_default=sa.false(), nullable=False))
        batch_op.add_column(sa.Column("required_approvals", sa.Integer(), server_default="0", nullable=False))
        batch_op.add_column(
            sa.Column("dismiss_stale_approvals", sa.Boolean(), server_default=sa.true(), nullable=False)
        )


def downgrade() -> None:
    with op.batch_alter_table("branch_rules", schema=None) as batch_op:
        batch_op.drop_column("dismiss_stale_approvals")
        batch_op.drop_column("required_approvals")
        batch_op.drop_column("require_pull_request")
    op.drop_index("ix_pull_review_requests_pull_id", table_name="pull_review_requests")
    op.drop_table("pull_review_requests")
    op.drop_index("ix_pull_comments_pull", table_name="pull_comments")
    op.drop_table("pull_comments")
    op.drop_index("ix_pull_reviews_pull", table_name="pull_reviews")
    op.drop_table("pull_reviews")
    op.drop_index("uq_pull_requests_open_head_base", table_name="pull_requests")
    op.drop_index("ix_pull_requests_repo_state", table_name="pull_requests")
    op.drop_table("pull_requests")
    op.drop_table("issue_counters")
