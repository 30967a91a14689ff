"""In-process fan-out of "something changed on task N": live views wake and read the database.

The database stays the source of truth; a notification only says "look again". Waiters on
another event loop (the test client's, a thread's) are woken thread-safely. Across processes (web
replicas and `forgehand worker`s on PostgreSQL) a relay carries the notifications
(forge/db/wakeups.py: `LISTEN/NOTIFY`); readers still poll every `poll_seconds` (1 s, 2 s with the
relay) so nothing depends on a notification arriving.
"""

import asyncio
import contextlib
import threading
from collections.abc import Callable

# A waiter: the event to set, and the loop it belongs to (set from whichever thread notifies).
Wake = tuple[asyncio.AbstractEventLoop, asyncio.Event]


class LiveHub:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiters: dict[int, set[Wake]] = {}
        self._listeners: list[Callable[[int], None]] = []
        self._relay: Callable[[int], None] | None = None
        self.poll_seconds = 1.0  # how often readers look without a notification

    def set_relay(self, relay: Callable[[int], None] | None, *, poll_seconds: float = 1.0) -> None:
        """Send every notification to other processes too (None: this process only)."""
        self._relay = relay
        self.poll_seconds = poll_seconds

    def notify(self, task_id: int) -> None:
        """Task `task_id` changed (committed): wake this process's readers, and the other
        processes' through the relay."""
        self.notify_local(task_id)
        relay = self._relay
        if relay is not None:
            relay(task_id)

    def notify_remote(self, task_ids: list[int]) -> None:
        """Tasks another process changed (heard through the relay): wake this process's readers."""
        for task_id in task_ids:
            self.notify_local(task_id)

    def notify_local(self, task_id: int) -> None:
        with self._lock:
            waiters = list(self._waiters.get(task_id, ()))
            listeners = list(self._listeners)
        for loop, event in waiters:
            with contextlib.suppress(RuntimeError):  # that loop is closed
                loop.call_soon_threadsafe(event.set)
        for listener in listeners:
            listener(task_id)

    def listen(self, fn: Callable[[int], None]) -> None:
        """Call `fn(task_id)` on every notification (the worker listens for stop requests)."""
        with self._lock:
            self._listeners.append(fn)

    def unlisten(self, fn: Callable[[int], None]) -> None:
        with self._lock:
            if fn in self._listeners:
                self._listeners.remove(fn)

    def add_waiter(self, task_id: int, wake: Wake) -> None:
        """Set `wake`'s event (on its loop) at every notification of the task, until removed."""
        with self._lock:
            self._waiters.setdefault(task_id, set()).add(wake)

    def remove_waiter(self, task_id: int, wake: Wake) -> None:
        with self._lock:
            waiters = self._waiters.get(task_id)
            if waiters is not None:
                waiters.discard(wake)
                if not waiters:
                    del self._waiters[task_id]

    async def wait(self, task_id: int, timeout: float) -> bool:  # noqa: ASYNC109
        """Wait until the task is notified or `timeout` passes; True when notified."""
        event = asyncio.Event()
        key = (asyncio.get_running_loop(), event)
        self.add_waiter(task_id, key)
        try:
            async with asyncio.timeout(timeout):
                await event.wait()
            return True
        except TimeoutError:
            return False
        finally:
            self.remove_waiter(task_id, key)

    def waiter(self, task_id: int) -> "Waiter":
        """A registration that catches notifications between reads (no lost wake-up)."""
        return Waiter(self, task_id)


class Waiter:
    def __init__(self, hub: LiveHub, task_id: int) -> None:
        self._hub = hub
        self._task_id = task_id
        self._event = asyncio.Event()
        self._key: Wake = (asyncio.get_running_loop(), self._event)

    def __enter__(self) -> "Waiter":
        self._hub.add_waiter(self._task_id, self._key)
        return self

    def __exit__(self, *exc: object) -> None:
        self._hub.remove_waiter(self._task_id, self._key)

    async def wait(self, timeout: float) -> bool:  # noqa: ASYNC109
        try:
            async with asyncio.timeout(timeout):
                await self._event.wait()
            return True
        except TimeoutError:
            return False
        finally:
            self._event.clear()
