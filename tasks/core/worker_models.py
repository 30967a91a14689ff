"""The workers' register: one row per `forgehand worker` process (or a server's in-process worker)
that ever started, with the Docker engine it uses and its lease.

A worker writes its row at start, renews `heartbeat_at` every second with its runs' heartbeats,
and records whether its engine answers. Other workers read it to take over a lapsed lease (the
dead worker's engine, to remove its containers there); `/healthz` and the admin Workers page
read it to say which workers claim and which cannot."""

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Boolean, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from forge.db.engine import Base, utcnow


class WorkerRecord(Base):
    __tablename__ = "workers"

    id: Mapped[str] = mapped_column(String(200), primary_key=True)  # host:pid:nonce, as runs' `owner`
    host: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int] = mapped_column(Integer)
    # The Docker engine it runs sandboxes on (its DOCKER_HOST, credentials never stored); "" is
    # the local default socket.
    engine: Mapped[str] = mapped_column(String(500), default="")
    labels: Mapped[list[Any]] = mapped_column(JSON, default=list)
    capacity: Mapped[int] = mapped_column(Integer)
    version: Mapped[str] = mapped_column(String(64), default="")
    running: Mapped[int] = mapped_column(Integer, default=0)
    engine_ok: Mapped[bool] = mapped_column(Boolean, default=True)
    engine_error: Mapped[str] = mapped_column(Text, default="")
    started_at: Mapped[datetime] = mapped_column(default=utcnow)
    heartbeat_at: Mapped[datetime] = mapped_column(default=utcnow, index=True)
    stopped_at: Mapped[datetime | None] = mapped_column(nullable=True)
