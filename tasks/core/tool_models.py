"""SQLAlchemy models of custom tools (docs/tools.md): a tool, its versions (never changed once
written) and its runs (each call, a task's agent's or an admin's test)."""

import uuid as uuid_mod
from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Boolean, CheckConstraint, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from forge.db.engine import Base, utcnow


def _uuid() -> str:
    return str(uuid_mod.uuid4())


class CustomTool(Base):
    """A custom tool (docs/tools.md): a script with a parameter schema that agents call as
    `custom_<name>`. Instance scope (`repo_id` NULL, instance admins) or a repository's (its
    admins). What it does lives in its versions; `active_version` is the one agents see."""

    __tablename__ = "custom_tools"
    # `scope` is "instance" or "repo:<id>": one name per scope (NULL repo ids are never equal in SQL).
    __table_args__ = (UniqueConstraint("scope", "name", name="uq_custom_tools_scope_name"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    scope: Mapped[str] = mapped_column(String(32))
    repo_id: Mapped[int | None] = mapped_column(
        ForeignKey("repositories.id", ondelete="CASCADE"), nullable=True, index=True
    )
    name: Mapped[str] = mapped_column(String(48))
    enabled: Mapped[bool] = mapped_column(Boolean, default=True)
    active_version: Mapped[int | None] = mapped_column(Integer, nullable=True)
    last_version: Mapped[int] = mapped_column(Integer, default=0)
    created_by_id: Mapped[int | None] = mapped_column(ForeignKey("accounts.id", ondelete="SET NULL"), nullable=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)


class CustomToolVersion(Base):
    """One version of a custom tool, never changed once written: a change is a new version (a
    draft until activated). `auto` mode only for a read-only tool (a database constraint too)."""

    __tablename__ = "custom_tool_versions"
    __table_args__ = (
        UniqueConstraint("tool_id", "version", name="uq_custom_tool_versions_tool_version"),
        CheckConstraint("mode IN ('approval', 'auto')", name="mode_known"),
        CheckConstraint("mode = 'approval' OR read_only", name="auto_only_read_only"),
        CheckConstraint("timeout_seconds BETWEEN 10 AND 1800", name="timeout_bounds"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    tool_id: Mapped[int] = mapped_column(ForeignKey("custom_tools.id", ondelete="CASCADE"), index=True)
    version: Mapped[int] = mapped_column(Integer)
    description: Mapped[str] = mapped_column(Text, default="")
    parameters: Mapped[dict[str, Any]] = mapped_column(JSON)
    script: Mapped[str] = mapped_column(Text)
    interpreter: Mapped[str] = mapped_column(String(16))
    mode: Mapped[str] = mapped_column(String(16))
    read_only: Mapped[bool] = mapped_column(Boolean, default=False)
    timeout_seconds: Mapped[int] = mapped_column(Integer, default=600)
    created_by_id: Mapped[int | None] = mapped_column(ForeignKey("accounts.id", ondelete="SET NULL"), nullable=True)
    # An agent's proposal (`propose_tool`): the task whose run proposed it.
    proposed_by_task_id: Mapped[int | None] = mapped_column(ForeignKey("tasks.id", ondelete="SET NULL"), nullable=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class CustomToolRun(Base):
    """One call of a custom tool: a task's agent's, or an admin's test run (`task_id` NULL). Its
    inputs are validated and hashed; an `approval` tool's run waits in `awaiting_approval` until a
    person approves exactly these inputs (then `queued`, once) or denies it."""

    __tablename__ = "custom_tool_runs"
    __table_args__ = (Index("ix_custom_tool_runs_state_expires", "state", "expires_at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    uuid: Mapped[str] = mapped_column(String(36), unique=True, default=_uuid)
    tool_id: Mapped[int] = mapped_column(ForeignKey("custom_tools.id", ondelete="CASCADE"), index=True)
    version: Mapped[int] = mapped_column(Integer)
    tool_name: Mapped[str] = mapped_column(String(48))
    repo_id: Mapped[int | None] = mapped_column(
        ForeignKey("repositories.id", ondelete="CASCADE"), nullable=True, index=True
    )
    task_id: Mapped[int | None] = mapped_column(ForeignKey("tasks.id", ondelete="CASCADE"), nullable=True, index=True)
    run_id: Mapped[int | None] = mapped_column(ForeignKey("task_runs.id", ondelete="CASCADE"), nullable=True)
    tool_use_id: Mapped[str] = mapped_column(String(200), default="")
    inputs: Mapped[dict[str, Any]] = mapped_column(JSON)
    inputs_hash: Mapped[str] = mapped_column(String(64))
    state: Mapped[str] = mapped_column(String(24))
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    output: Mapped[str] = mapped_column(Text, default="")
    failure_reason: Mapped[str | None] = mapped_column(String(32), nullable=True)
    requested_by_id: Mapped[int | None] = mapped_column(ForeignKey("accounts.id", ondelete="SET NULL"), nullable=True)
    decided_by_id: Mapped[int | None] = mapped_column(ForeignKey("accounts.id", ondelete="SET NULL"), nullable=True)
    decided_at: Mapped[datetime | None] = mapped_column(nullable=True)
    expires_at: Mapped[datetime | None] = mapped_column(nullable=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(nullable=True)
    duration_ms: Mapped[int | None] = mapped_column(Integer, nullable=True)
