"""Reading and writing the workers' register (`tasks.core.worker_models`): a worker's row at its
start, its beat, its engine's state; the list `/healthz` and the admin Workers page show.

A worker's state, as they show it:
- `claiming`: its beat is within the lease and its engine answers;
- `engine_unreachable`: its beat is within the lease but its Docker engine does not answer, so
  it claims nothing (the error says why);
- `stopped`: it shut down cleanly;
- `lost`: no beat for longer than the lease (killed, host off, network cut): its runs are taken
  over by another worker."""

from datetime import datetime, timedelta
from typing import Literal
from urllib.parse import urlsplit, urlunsplit

import msgspec
from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession

from forge.db.engine import utcnow
from tasks.core.worker_models import WorkerRecord

WorkerState = Literal["claiming", "engine_unreachable", "stopped", "lost"]
SHOWN_FOR = timedelta(days=1)  # a stopped or lost worker stays listed this long


class WorkerView(msgspec.Struct, frozen=True, kw_only=True):
    """A worker as `/healthz` and `GET /api/v1/admin/workers` show it."""

    id: str
    host: str
    engine: str
    labels: list[str]
    capacity: int
    running: int
    state: WorkerState
    engine_error: str
    version: str
    started_at: datetime
    last_seen_seconds: float


def engine_label(docker_host: str) -> str:
    """A DOCKER_HOST as the register keeps it: without a password (a `tcp://` URL's user info)."""
    if not docker_host:
        return ""
    parts = urlsplit(docker_host)
    if parts.password is None:
        return docker_host
    host = parts.hostname or ""
    netloc = f"{parts.username}@{host}" if parts.username else host
    if parts.port:
        netloc += f":{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


async def register(session: AsyncSession, record: WorkerRecord) -> None:
    """The worker's row, written at its start (a restarted process has a new id, so a new row)."""
    session.add(record)


async def beat(session: AsyncSession, worker_id: str, *, running: int, engine_ok: bool, engine_error: str) -> None:
    await session.execute(
        update(WorkerRecord)
        .where(WorkerRecord.id == worker_id)
        .values(heartbeat_at=utcnow(), running=running, engine_ok=engine_ok, engine_error=engine_error)
    )


async def stopped(session: AsyncSession, worker_id: str) -> None:
    await session.execute(
        update(WorkerRecord).where(WorkerRecord.id == worker_id).values(stopped_at=utcnow(), running=0)
    )


async def find(session: AsyncSession, worker_id: str) -> WorkerRecord | None:
    return await session.get(WorkerRecord, worker_id)


def state_of(row: WorkerRecord, lease: float, now: datetime) -> WorkerState:
    if row.stopped_at is not None:
        return "stopped"
    if (now - row.heartbeat_at).total_seconds() > lease:
        return "lost"
    return "claiming" if row.engine_ok else "engine_unreachable"


async def listing(session: AsyncSession, lease: float) -> list[WorkerView]:
    """The workers seen in the last day, the live ones first, newest first."""
    now = utcnow()
    rows = (
        (
            await session.execute(
                select(WorkerRecord)
                .where(WorkerRecord.heartbeat_at > now - SHOWN_FOR)
                .order_by(WorkerRecord.heartbeat_at.desc())
                .limit(200)
            )
        )
        .scalars()
        .all()
    )
    views = [
        WorkerView(
            id=r.id,
            host=r.host,
            engine=r.engine or "local Docker engine (default socket)",
            labels=[str(x) for x in r.labels],
            capacity=r.capacity,
            running=r.running if state_of(r, lease, now) in ("claiming", "engine_unreachable") else 0,
            state=state_of(r, lease, now),
            engine_error=r.engine_error,
            version=r.version,
            started_at=r.started_at,
            last_seen_seconds=round(max(0.0, (now - r.heartbeat_at).total_seconds()), 1),
        )
        for r in rows
    ]
    order = {"claiming": 0, "engine_unreachable": 1, "lost": 2, "stopped": 3}
    return sorted(views, key=lambda v: order[v.state])
