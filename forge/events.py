"""Domain events. Every state change publishes one, inside the transaction that makes the change.

`forge` only defines the envelope and the bus; subscribers are wired by the composition root
(`forge/app.py`): the webhooks package writes outbox rows for them (same transaction, so a
crash cannot lose one), the tasks package fans transcript events out to live views.

Event types (the notification table of the webhook contract): `task.created`,
`task.state_changed`, `run.started`, `run.finished`, `approval.requested`, `approval.resolved`,
`review.submitted`, `task.merged`, `repo.pushed`, `ping`. New fields get defaults; a field's
type never changes (msgspec schema evolution rules)."""

import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any, Literal

import msgspec
from sqlalchemy.ext.asyncio import AsyncSession

from forge.db import utcnow

EventType = Literal[
    "task.created",
    "task.state_changed",
    "run.started",
    "run.finished",
    "approval.requested",
    "approval.resolved",
    "review.submitted",
    "task.merged",
    "repo.pushed",
    "ping",
]


class AccountRef(msgspec.Struct, frozen=True, kw_only=True):
    login: str
    type: Literal["User", "Bot"] = "User"


class TaskRef(msgspec.Struct, frozen=True, kw_only=True):
    id: str  # uuid
    number: int
    url: str = ""


class RunRef(msgspec.Struct, frozen=True, kw_only=True):
    id: str  # uuid
    seq: int


class Event(msgspec.Struct, frozen=True, kw_only=True):
    type: EventType
    repo_id: int | None  # None for instance-wide events (ping of an instance endpoint)
    repo_uuid: str = ""
    repository: str = ""  # owner/name
    task: TaskRef | None = None
    run: RunRef | None = None
    actor: AccountRef | None = None
    agent: AccountRef | None = None
    data: dict[str, Any] = msgspec.field(default_factory=dict)
    # Stable across retries and redeliveries: consumers deduplicate on it.
    id: str = msgspec.field(default_factory=lambda: str(uuid.uuid4()))
    at: datetime = msgspec.field(default_factory=utcnow)


Subscriber = Callable[[AsyncSession, Event], Awaitable[None]]


class EventBus:
    """Synchronous, in-transaction fan-out to subscribers. A subscriber that raises aborts the
    change it reports (the transaction rolls back): nothing is published that did not happen,
    nothing happens that is not published."""

    def __init__(self) -> None:
        self._subscribers: list[Subscriber] = []

    def subscribe(self, subscriber: Subscriber) -> None:
        self._subscribers.append(subscriber)

    async def publish(self, session: AsyncSession, event: Event) -> None:
        for subscriber in self._subscribers:
            await subscriber(session, event)
