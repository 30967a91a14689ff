"""The workers as instance admins see them (`GET /api/v1/admin/workers`, Admin > Workers) and as
`/healthz` tells them: the register's rows with their state (tasks/core/worker_registry.py)."""

from sqlalchemy.ext.asyncio import AsyncSession

from forge.core.access import INSTANCE, Action, require
from forge.core.settings import Settings
from forge.db.audit import Actor
from tasks.core import worker_registry
from tasks.core.worker_registry import WorkerView


async def list_workers(session: AsyncSession, actor: Actor, settings: Settings) -> list[WorkerView]:
    require(actor.principal, Action.INSTANCE_ADMIN, INSTANCE)
    return await worker_registry.listing(session, settings.worker_lease_seconds)


async def health(session: AsyncSession, settings: Settings) -> tuple[bool, dict[str, int]]:
    """For `/healthz` (answered to anyone: a load balancer's probe): whether every live worker can
    claim, and how many workers are in each state but `stopped`. Which workers, their hosts and
    engines are for instance admins only (`list_workers`)."""
    views = await worker_registry.listing(session, settings.worker_lease_seconds)
    counts = {"claiming": 0, "engine_unreachable": 0, "lost": 0}
    for v in views:
        if v.state in counts:
            counts[v.state] += 1
    return counts["engine_unreachable"] == 0, counts
