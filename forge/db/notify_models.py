"""SQLAlchemy models of notifications (forge.notify; docs/notifications.md): the inbox's threads,
who follows which thread, repository watching, each person's notification settings and the
e-mail outbox."""

from datetime import datetime

from sqlalchemy import JSON, Boolean, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from forge.db.engine import Base, utcnow


class Notification(Base):
    """One inbox thread of a person: one row per recipient and subject (an issue, a pull request,
    a task), bumped (unread again, newer `updated_at`, the latest reason and actor) on new activity,
    as GitHub's notification threads are."""

    __tablename__ = "notifications"
    __table_args__ = (
        UniqueConstraint(
            "account_id", "repo_id", "subject_type", "subject_number", name="uq_notifications_account_subject"
        ),
        Index("ix_notifications_account_updated", "account_id", "done", "updated_at"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id", ondelete="CASCADE"))
    repo_id: Mapped[int] = mapped_column(ForeignKey("repositories.id", ondelete="CASCADE"), index=True)
    subject_type: Mapped[str] = mapped_column(String(16))  # issue | pull_request | task
    subject_number: Mapped[int] = mapped_column(Integer)
    subject_title: Mapped[str] = mapped_column(String(256))
    subject_url: Mapped[str] = mapped_column(String(1000))  # the page
    reason: Mapped[str] = mapped_column(String(24))
    unread: Mapped[bool] = mapped_column(Boolean, default=True)
    done: Mapped[bool] = mapped_column(Boolean, default=False)
    last_actor: Mapped[str] = mapped_column(String(40), default="")  # a login, kept as text
    last_read_at: Mapped[datetime | None] = mapped_column(nullable=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)


class NotificationThread(Base):
    """A person follows a thread (GitHub's thread subscription): they opened it, commented, were
    mentioned, assigned or asked to review. Later activity on it reaches them; `ignored` (the
    e-mail's unsubscribe link, or the inbox) stops it."""

    __tablename__ = "notification_threads"
    __table_args__ = (
        UniqueConstraint(
            "repo_id", "subject_type", "subject_number", "account_id", name="uq_notification_threads_subject_account"
        ),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id", ondelete="CASCADE"), index=True)
    repo_id: Mapped[int] = mapped_column(ForeignKey("repositories.id", ondelete="CASCADE"))
    subject_type: Mapped[str] = mapped_column(String(16))
    subject_number: Mapped[int] = mapped_column(Integer)
    reason: Mapped[str] = mapped_column(String(24))  # why they follow it: author, comment, mention ...
    ignored: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class RepoSubscription(Base):
    """How closely a person watches a repository: `all` (every new issue, pull request and
    comment), `ignore` (nothing, not even mentions). No row: `participating`, the default."""

    __tablename__ = "repo_subscriptions"
    __table_args__ = (UniqueConstraint("repo_id", "account_id", name="uq_repo_subscriptions_repo_account"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    repo_id: Mapped[int] = mapped_column(ForeignKey("repositories.id", ondelete="CASCADE"))
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id", ondelete="CASCADE"), index=True)
    level: Mapped[str] = mapped_column(String(16))  # all | participating | ignore
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)


class NotificationSetting(Base):
    """A person's notification settings: where each reason goes (`off`, `web`, or `email`: the
    inbox and an e-mail) and the address e-mail goes to. No row: every reason to the inbox."""

    __tablename__ = "notification_settings"

    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id", ondelete="CASCADE"), primary_key=True)
    email: Mapped[str] = mapped_column(String(254), default="")
    # reason -> off | web | email; a reason left out is `web`.
    channels: Mapped[dict[str, str]] = mapped_column(JSON, default=dict)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)


class MailOutbox(Base):
    """An e-mail to send, written in the transaction of the notification it tells of (a crash loses
    none); the mailer claims a row under a lease, sends it and marks it sent, or schedules a retry."""

    __tablename__ = "mail_outbox"
    __table_args__ = (Index("ix_mail_outbox_due", "state", "next_attempt_at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    account_id: Mapped[int | None] = mapped_column(ForeignKey("accounts.id", ondelete="SET NULL"), nullable=True)
    to_addr: Mapped[str] = mapped_column(String(254))
    subject: Mapped[str] = mapped_column(String(300))
    body: Mapped[str] = mapped_column(Text)
    message_id: Mapped[str] = mapped_column(String(300))  # this message's, unique
    thread_id: Mapped[str] = mapped_column(String(300))  # In-Reply-To / References: the thread's
    unsubscribe_url: Mapped[str] = mapped_column(String(2000))
    state: Mapped[str] = mapped_column(String(8), default="pending")  # pending | sent | failed
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime] = mapped_column(default=utcnow)
    lease_until: Mapped[datetime | None] = mapped_column(nullable=True)
    claim_token: Mapped[str | None] = mapped_column(String(32), nullable=True)
    last_error: Mapped[str] = mapped_column(String(500), default="")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    sent_at: Mapped[datetime | None] = mapped_column(nullable=True)
