"""A process-wide generation counter of endpoint configuration, and a small cache keyed by it.

Every ORM insert or delete of a `WebhookEndpoint`, and every update of a column that decides who is
called and how (`url`, `kind`, `events`, `failure_policy`, `active`, `repo_id`, the secrets), bumps
the generation twice: when the change is flushed and again when its transaction commits (a reader
that reloaded between the two read the old committed state and is invalidated by the second bump).
Health bookkeeping (`failing_since`, `last_success_at`) does not bump it. This covers every path
in this process: the service (create, update, delete, each rotation step), the deliverer's own
disabling, tests and scripts using the ORM.

Other processes (replicas, workers) cannot bump this counter, so a cached entry also expires after
`TTL` seconds: a change made elsewhere is seen at most that late. A `TTL` of 1 s bounds that
window; the cost is one read of the endpoints per repository and second per process.
"""

import threading
import time
from collections.abc import Hashable
from typing import Any, Generic, TypeVar

from sqlalchemy import event, inspect
from sqlalchemy.orm import Session, object_session

from webhooks.core.models import WebhookEndpoint

TTL = 1.0
_PENDING = "webhooks_endpoints_changed"
# Columns whose change alters which endpoints a dispatch calls, where, and with which key.
_WATCHED = (
    "url",
    "kind",
    "events",
    "failure_policy",
    "active",
    "repo_id",
    "secret_kid",
    "secret_enc",
    "second_kid",
    "second_enc",
    "second_role",
)

_lock = threading.Lock()
_generation = 0


def generation() -> int:
    """The current generation (an int read: cheap enough for every dispatch)."""
    return _generation


def bump() -> None:
    """Invalidate every cache built on endpoint configuration in this process."""
    global _generation
    with _lock:
        _generation += 1


def _mark(target: WebhookEndpoint) -> None:
    bump()
    session = object_session(target)
    if session is not None:
        session.info[_PENDING] = True


def _inserted_or_deleted(_mapper: Any, _connection: Any, target: WebhookEndpoint) -> None:
    _mark(target)


def _updated(_mapper: Any, _connection: Any, target: WebhookEndpoint) -> None:
    state = inspect(target)
    if any(state.attrs[name].history.has_changes() for name in _WATCHED):
        _mark(target)


def _after_commit(session: Session) -> None:
    if session.info.pop(_PENDING, None):
        bump()


event.listen(WebhookEndpoint, "after_insert", _inserted_or_deleted)
event.listen(WebhookEndpoint, "after_delete", _inserted_or_deleted)
event.listen(WebhookEndpoint, "after_update", _updated)
event.listen(Session, "after_commit", _after_commit)

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class GenerationCache(Generic[K, V]):
    """Values valid while the generation is unchanged and for at most `ttl` seconds.

    Take `generation()` *before* loading and `put` with it: a change committed while loading
    then leaves the entry already stale."""

    def __init__(self, ttl: float = TTL, max_entries: int = 4096) -> None:
        self.ttl = ttl
        self.max_entries = max_entries
        self._entries: dict[K, tuple[int, float, V]] = {}

    def get(self, key: K) -> V | None:
        found = self.lookup(key)
        return found[0] if found is not None else None

    def lookup(self, key: K) -> tuple[V, bool] | None:
        """The value and whether it is past half its time (worth reloading ahead, in the
        background, so that a busy caller never waits for the reload); None when not valid."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        gen, loaded, value = entry
        age = time.monotonic() - loaded
        if gen != _generation or age > self.ttl:
            return None
        return value, age > self.ttl / 2

    def put(self, key: K, gen: int, value: V, loaded: float | None = None) -> None:
        """`gen`: the generation read before loading; `loaded`: `time.monotonic()` then (the age
        counts from the read, so that no entry is served more than `ttl` after it)."""
        if len(self._entries) >= self.max_entries:
            self._entries.clear()
        self._entries[key] = (gen, time.monotonic() if loaded is None else loaded, value)

    def clear(self) -> None:
        self._entries.clear()
