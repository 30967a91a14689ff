"""SQLAlchemy model of repository secrets: the setup-only secrets a repository's environment
uses (a package index token, a private mirror token), encrypted at rest (forge.repos.repo_secrets;
docs/repositories.md, "Secrets")."""

from datetime import datetime

from sqlalchemy import ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from forge.db.engine import Base, utcnow


class RepoSecret(Base):
    """One secret of a repository: its name (unique in the repository, case kept) and its value
    sealed with the repository secrets' SecretBox. The value is never read back by a response."""

    __tablename__ = "repo_secrets"
    __table_args__ = (UniqueConstraint("repo_id", "name", name="uq_repo_secrets_repo_name"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    repo_id: Mapped[int] = mapped_column(ForeignKey("repositories.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(128))
    value_encrypted: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)
