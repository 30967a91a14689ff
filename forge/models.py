"""SQLAlchemy models of the host: accounts, tokens, web sessions, audit."""

from datetime import datetime
from enum import StrEnum

from sqlalchemy import JSON, Boolean, ForeignKey, Index, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column, relationship

from forge.db import Base, utcnow


class AccountType(StrEnum):
    USER = "User"
    BOT = "Bot"


class Account(Base):
    """A person (`User`, signs in with a password) or a `Bot` (acts only through tokens)."""

    __tablename__ = "accounts"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    login: Mapped[str] = mapped_column(String(40))
    # Logins are unique case-insensitively; lookups go through this column.
    login_key: Mapped[str] = mapped_column(String(40), unique=True)
    type: Mapped[str] = mapped_column(String(8), default=AccountType.USER)
    display_name: Mapped[str] = mapped_column(String(200), default="")
    password_hash: Mapped[str | None] = mapped_column(String(200), nullable=True)
    is_admin: Mapped[bool] = mapped_column(Boolean, default=False)
    disabled: Mapped[bool] = mapped_column(Boolean, default=False)
    # For bots: the person responsible for it.
    owner_id: Mapped[int | None] = mapped_column(ForeignKey("accounts.id", ondelete="SET NULL"), nullable=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)

    @property
    def is_bot(self) -> bool:
        return self.type == AccountType.BOT


class AccessToken(Base):
    """A personal access token. Only a SHA-256 of the secret is stored, plus its last eight characters."""

    __tablename__ = "access_tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(100))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    last_eight: Mapped[str] = mapped_column(String(8))
    # Space-separated scope names, as granted (implications are applied when checking).
    scopes: Mapped[str] = mapped_column(String(300))
    expires_at: Mapped[datetime | None] = mapped_column(nullable=True)
    last_used_at: Mapped[datetime | None] = mapped_column(nullable=True)
    revoked_at: Mapped[datetime | None] = mapped_column(nullable=True)
    created_by_id: Mapped[int | None] = mapped_column(ForeignKey("accounts.id", ondelete="SET NULL"), nullable=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    account: Mapped[Account] = relationship(foreign_keys=[account_id], lazy="raise")


class WebSession(Base):
    """A signed-in browser. The cookie holds a random id; only its SHA-256 is stored."""

    __tablename__ = "web_sessions"

    id_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id", ondelete="CASCADE"), index=True)
    csrf_token: Mapped[str] = mapped_column(String(64))
    client_addr: Mapped[str] = mapped_column(String(64), default="")
    user_agent: Mapped[str] = mapped_column(String(300), default="")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[datetime] = mapped_column()
    last_seen_at: Mapped[datetime] = mapped_column(default=utcnow)


class AuditEvent(Base):
    """One row per mutating action and per refused attempt."""

    __tablename__ = "audit_events"
    __table_args__ = (
        Index("ix_audit_events_action_at", "action", "at"),
        Index("ix_audit_events_target_at", "target", "at"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    at: Mapped[datetime] = mapped_column(default=utcnow, index=True)
    actor_id: Mapped[int | None] = mapped_column(
        ForeignKey("accounts.id", ondelete="SET NULL"), nullable=True, index=True
    )
    # Kept as text so the row still reads right after the account is renamed or removed.
    actor_login: Mapped[str] = mapped_column(String(40), default="")
    token_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    client_addr: Mapped[str] = mapped_column(String(64), default="")
    action: Mapped[str] = mapped_column(String(64))
    target: Mapped[str] = mapped_column(String(300), default="")
    result: Mapped[str] = mapped_column(String(16))
    detail: Mapped[dict[str, object]] = mapped_column(JSON, default=dict)
    request_id: Mapped[str] = mapped_column(Text, default="")
