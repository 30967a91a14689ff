"""SQLAlchemy models of issues: the issue, its labels, assignees, milestone, comments (with their
edit history) and its timeline (forge.repos.issues; docs/issues.md)."""

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from forge.db.engine import Base, utcnow


class Label(Base):
    """A label of a repository: a name (unique per repository, whatever its case), a colour and a
    description."""

    __tablename__ = "labels"
    __table_args__ = (UniqueConstraint("repo_id", "name_key", name="uq_labels_repo_name"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    repo_id: Mapped[int] = mapped_column(ForeignKey("repositories.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(50))
    name_key: Mapped[str] = mapped_column(String(50))  # casefolded
    color: Mapped[str] = mapped_column(String(6))  # six hex digits, lower case, no '#'
    description: Mapped[str] = mapped_column(String(200), default="")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Milestone(Base):
    """A milestone of a repository: a title, an optional due date, open or closed; its progress is
    the share of its issues that are closed."""

    __tablename__ = "milestones"
    __table_args__ = (
        UniqueConstraint("repo_id", "number", name="uq_milestones_repo_number"),
        UniqueConstraint("repo_id", "title_key", name="uq_milestones_repo_title"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    repo_id: Mapped[int] = mapped_column(ForeignKey("repositories.id", ondelete="CASCADE"))
    number: Mapped[int] = mapped_column(Integer)
    title: Mapped[str] = mapped_column(String(100))
    title_key: Mapped[str] = mapped_column(String(100))  # casefolded
    description: Mapped[str] = mapped_column(Text, default="")
    due_on: Mapped[datetime | None] = mapped_column(nullable=True)
    state: Mapped[str] = mapped_column(String(8), default="open")  # open | closed
    closed_at: Mapped[datetime | None] = mapped_column(nullable=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)


class Issue(Base):
    """An issue of a repository. Its number comes from the sequence it shares with pull requests
    (`issue_counters`)."""

    __tablename__ = "issues"
    __table_args__ = (
        UniqueConstraint("repo_id", "number", name="uq_issues_repo_number"),
        Index("ix_issues_repo_state", "repo_id", "state", "number"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    repo_id: Mapped[int] = mapped_column(ForeignKey("repositories.id", ondelete="CASCADE"))
    number: Mapped[int] = mapped_column(Integer)
    title: Mapped[str] = mapped_column(String(256))
    body: Mapped[str] = mapped_column(Text, default="")
    state: Mapped[str] = mapped_column(String(8), default="open")  # open | closed
    # completed | not_planned | duplicate when closed; reopened after a reopen; null when new.
    state_reason: Mapped[str | None] = mapped_column(String(16), nullable=True)
    author_id: Mapped[int | None] = mapped_column(ForeignKey("accounts.id", ondelete="SET NULL"), nullable=True)
    # The author could not write to the repository when they opened it: an agent reads it as
    # untrusted, and it is assigned to a bot only where the repository allows that.
    author_untrusted: Mapped[bool] = mapped_column(default=False)
    milestone_id: Mapped[int | None] = mapped_column(
        ForeignKey("milestones.id", ondelete="SET NULL"), nullable=True, index=True
    )
    closed_by_id: Mapped[int | None] = mapped_column(ForeignKey("accounts.id", ondelete="SET NULL"), nullable=True)
    closed_at: Mapped[datetime | None] = mapped_column(nullable=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)


class IssueLabel(Base):
    __tablename__ = "issue_labels"

    issue_id: Mapped[int] = mapped_column(ForeignKey("issues.id", ondelete="CASCADE"), primary_key=True)
    label_id: Mapped[int] = mapped_column(ForeignKey("labels.id", ondelete="CASCADE"), primary_key=True, index=True)


class IssueAssignee(Base):
    __tablename__ = "issue_assignees"

    issue_id: Mapped[int] = mapped_column(ForeignKey("issues.id", ondelete="CASCADE"), primary_key=True)
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id", ondelete="CASCADE"), primary_key=True, index=True)
    assigned_by_id: Mapped[int | None] = mapped_column(ForeignKey("accounts.id", ondelete="SET NULL"), nullable=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class IssueComment(Base):
    """A comment on an issue's conversation."""

    __tablename__ = "issue_comments"
    __table_args__ = (Index("ix_issue_comments_issue", "issue_id", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    issue_id: Mapped[int] = mapped_column(ForeignKey("issues.id", ondelete="CASCADE"))
    author_id: Mapped[int | None] = mapped_column(ForeignKey("accounts.id", ondelete="SET NULL"), nullable=True)
    body: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)


class IssueEdit(Base):
    """The text an edit replaced: an issue's title and body, or a comment's body (edit history)."""

    __tablename__ = "issue_edits"
    __table_args__ = (Index("ix_issue_edits_issue", "issue_id", "comment_id", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    issue_id: Mapped[int] = mapped_column(ForeignKey("issues.id", ondelete="CASCADE"))
    comment_id: Mapped[int | None] = mapped_column(ForeignKey("issue_comments.id", ondelete="CASCADE"), nullable=True)
    title_before: Mapped[str | None] = mapped_column(String(256), nullable=True)
    body_before: Mapped[str | None] = mapped_column(Text, nullable=True)
    editor_id: Mapped[int | None] = mapped_column(ForeignKey("accounts.id", ondelete="SET NULL"), nullable=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class IssueEvent(Base):
    """One entry of an issue's timeline besides its comments: labeled, unlabeled, assigned,
    unassigned, milestoned, demilestoned, renamed, closed, reopened, referenced (a commit or pull
    request said `Fixes #N`), cross-referenced (another issue or pull request mentioned it), and
    the tasks started from it (GitHub's timeline event names where they exist)."""

    __tablename__ = "issue_events"
    __table_args__ = (Index("ix_issue_events_issue", "issue_id", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    issue_id: Mapped[int] = mapped_column(ForeignKey("issues.id", ondelete="CASCADE"))
    actor_id: Mapped[int | None] = mapped_column(ForeignKey("accounts.id", ondelete="SET NULL"), nullable=True)
    event: Mapped[str] = mapped_column(String(32))
    data: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
