"""The request body: `{"type", "meta", "data"}`, compact UTF-8 JSON, and its JWT subject."""

from datetime import datetime
from typing import Any

import msgspec

from forge.db.events import AccountRef, Event, RunRef, TaskRef, data_of
from forge.db.models import Repository
from webhooks.sdk.protocol import SCHEMA_VERSION


class RepoRef(msgspec.Struct, frozen=True, kw_only=True):
    """The repository a policy event concerns (`RepoRef.of(repository_row)` builds one)."""

    id: int
    uuid: str
    full_name: str  # owner/name

    @classmethod
    def of(cls, repo: Repository) -> "RepoRef":
        return cls(id=repo.id, uuid=repo.uuid, full_name=f"{repo.owner.login}/{repo.name}")


class TaskMeta(msgspec.Struct, frozen=True, kw_only=True):
    """Who and what a policy event is about: the task (none for a pull request's merge), the run,
    the person, the agent."""

    task: TaskRef | None = None
    run: RunRef | None = None
    actor: AccountRef | None = None
    agent: AccountRef | None = None


class Meta(msgspec.Struct, kw_only=True):
    delivery_id: str
    schema_version: int
    instance: str
    repository: str | None
    repository_uuid: str | None
    task: TaskRef | None
    run: RunRef | None
    actor: AccountRef | None
    agent: AccountRef | None
    occurred_at: datetime


class Envelope(msgspec.Struct, kw_only=True):
    type: str
    meta: Meta
    data: dict[str, Any]


_encoder = msgspec.json.Encoder()


def subject(task: TaskRef | None, repo_uuid: str | None, instance: str) -> str:
    if task is not None:
        return f"forgehand:task:{task.id}"
    if repo_uuid:
        return f"forgehand:repo:{repo_uuid}"
    return f"forgehand:instance:{instance}"


def encode(envelope: Envelope) -> bytes:
    return _encoder.encode(envelope)


def for_event(event: Event, instance: str) -> tuple[bytes, str]:
    """Body and subject of a notification."""
    env = Envelope(
        type=event.type,
        meta=Meta(
            delivery_id=event.id,
            schema_version=SCHEMA_VERSION,
            instance=instance,
            repository=event.repository or None,
            repository_uuid=event.repo_uuid or None,
            task=event.task,
            run=event.run,
            actor=event.actor,
            agent=event.agent,
            occurred_at=event.at,
        ),
        data=data_of(event.data),
    )
    return encode(env), subject(event.task, event.repo_uuid, instance)


def for_policy(
    event_type: str, wid: str, instance: str, repo: RepoRef, task_meta: TaskMeta, data: dict[str, Any], at: datetime
) -> tuple[bytes, str]:
    """Body and subject of a policy call."""
    env = Envelope(
        type=event_type,
        meta=Meta(
            delivery_id=wid,
            schema_version=SCHEMA_VERSION,
            instance=instance,
            repository=repo.full_name,
            repository_uuid=repo.uuid,
            task=task_meta.task,
            run=task_meta.run,
            actor=task_meta.actor,
            agent=task_meta.agent,
            occurred_at=at,
        ),
        data=data,
    )
    return encode(env), subject(task_meta.task, repo.uuid, instance)
