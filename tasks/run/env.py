"""What one run's execution is given: the environment of the worker that claimed it (database,
repository store, sandbox engine, settings, event bus, live hub, policy gate, runtimes, clock),
passed explicitly so an execution never reaches into the worker."""

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from sqlalchemy.ext.asyncio import AsyncSession

from forge.core.settings import Settings
from forge.db.engine import Database
from forge.db.events import EventBus
from forge.git import RepoStore
from sandbox import SandboxEngine, SandboxPool
from tasks.core.lifecycle import Lifecycle
from tasks.core.live import LiveHub
from tasks.core.policy import PolicyGate
from tasks.run.runtimes.base import Runtime


@dataclass(frozen=True, kw_only=True)
class RunEnv:
    db: Database
    store: RepoStore
    engine: SandboxEngine
    settings: Settings
    bus: EventBus
    hub: LiveHub
    gate: PolicyGate
    runtimes: Mapping[str, Runtime]
    worker_id: str
    image: str
    instance: str
    extra_secrets: tuple[str, ...] = ()
    agents_image: str = ""  # "" = sandbox.DEFAULT_AGENTS_IMAGE (CLI agent runtimes)
    clock: Callable[[], float] = field(default=time.monotonic)
    # Warm pools of started sandboxes by image (tasks/run/warm.py), filled by the worker; empty = off.
    pools: dict[str, SandboxPool] = field(default_factory=dict)
    # One lock per environment image being built in this process (tasks/run/environment.py).
    environment_builds: dict[str, asyncio.Lock] = field(default_factory=dict)

    def lifecycle(self, session: AsyncSession) -> Lifecycle:
        """Task steps on `session`; what they touch wakes live views (and workers) after the commit."""
        return Lifecycle(
            session, bus=self.bus, base_url=self.settings.effective_base_url, gate=self.gate, changed=self.hub.notify
        )
