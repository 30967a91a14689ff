"""Wake-ups between processes through the database's own engine: on PostgreSQL, `LISTEN/NOTIFY`
carried by Litestar channels; on SQLite (one process) nothing leaves the process.

What travels is only "task N changed" (the ids, coalesced per loop turn). The database stays the
source of truth: a process that hears an id wakes its live views and its worker, which read the
database again; a wake-up lost (a dropped connection) costs a poll interval, never data. Every
process's own ids are skipped on the way back (each message carries its origin).

The backend is ours, not Litestar's `AsyncPgChannelsBackend`: that one opens a new connection for
every message it publishes (a task's transcript publishes several a second) and does not listen
again when its connection drops. Ours keeps one publishing connection and one listening
connection, each reopened on failure, every call under a timeout."""

import asyncio
import contextlib
import secrets
from collections.abc import AsyncGenerator, Callable, Iterable

import asyncpg
import structlog
from litestar.channels import ChannelsBackend, ChannelsPlugin

log = structlog.get_logger("forgehand.db")

CHANNEL = "forgehand_changes"
CONNECT_TIMEOUT = 5.0
PUBLISH_TIMEOUT = 5.0
RECONNECT_SECONDS = 1.0
MAX_IDS = 600  # ids per message (NOTIFY payloads stay far under PostgreSQL's 8000-byte limit)


def asyncpg_dsn(database_url: str) -> str:
    """The SQLAlchemy URL (`postgresql+asyncpg://...`) as asyncpg takes it."""
    return database_url.replace("postgresql+asyncpg://", "postgresql://", 1)


class PgNotifyBackend(ChannelsBackend):
    """Litestar channels over PostgreSQL `LISTEN/NOTIFY` with lasting, self-healing connections."""

    def __init__(self, dsn: str) -> None:
        self._dsn = dsn
        self._channels: set[str] = set()
        self._queue: asyncio.Queue[tuple[str, bytes]] = asyncio.Queue()
        self._publisher: asyncpg.Connection | None = None
        self._listener: asyncpg.Connection | None = None
        self._lock = asyncio.Lock()
        self._keeper: asyncio.Task[None] | None = None
        self._lost = asyncio.Event()
        self.listening = asyncio.Event()  # set while the listening connection is up

    async def _connect(self) -> asyncpg.Connection:
        return await asyncpg.connect(self._dsn, timeout=CONNECT_TIMEOUT)

    async def on_startup(self) -> None:
        self._keeper = asyncio.create_task(self._keep_listening(), name="forgehand-wakeups-listener")

    async def on_shutdown(self) -> None:
        if self._keeper is not None:
            self._keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._keeper
        for conn in (self._listener, self._publisher):
            if conn is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(conn.close(), timeout=CONNECT_TIMEOUT)
        self._listener = self._publisher = None

    async def _keep_listening(self) -> None:
        """Hold the listening connection: open it, listen on every channel, and on its loss open
        another (a notification sent meanwhile is lost: the readers' poll covers it)."""
        while True:
            try:
                conn = await self._connect()
                conn.add_termination_listener(lambda _conn: self._lost.set())
                async with self._lock:
                    for channel in self._channels:
                        await conn.add_listener(channel, self._heard)
                    self._listener = conn
                self.listening.set()
                await self._lost.wait()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("listening for wake-ups failed: retrying", error=str(exc))
            self.listening.clear()
            self._lost.clear()
            self._listener = None
            await asyncio.sleep(RECONNECT_SECONDS)  # between attempts against a database that is down

    def _heard(self, _conn: object, _pid: int, channel: str, payload: object) -> None:
        if isinstance(payload, str):
            self._queue.put_nowait((channel, payload.encode()))

    async def publish(self, data: bytes, channels: Iterable[str]) -> None:
        for attempt in (1, 2):
            try:
                if self._publisher is None or self._publisher.is_closed():
                    self._publisher = await self._connect()
                for channel in channels:
                    await self._publisher.execute(
                        "SELECT pg_notify($1, $2)", channel, data.decode(), timeout=PUBLISH_TIMEOUT
                    )
                return
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError) as exc:
                self._publisher = None
                if attempt == 2:
                    log.warning("a wake-up could not be published", error=str(exc))

    async def subscribe(self, channels: Iterable[str]) -> None:
        async with self._lock:
            for channel in set(channels) - self._channels:
                self._channels.add(channel)
                if self._listener is not None:
                    await self._listener.add_listener(channel, self._heard)

    async def unsubscribe(self, channels: Iterable[str]) -> None:
        async with self._lock:
            for channel in set(channels) & self._channels:
                self._channels.discard(channel)
                if self._listener is not None:
                    with contextlib.suppress(Exception):
                        await self._listener.remove_listener(channel, self._heard)

    async def stream_events(self) -> AsyncGenerator[tuple[str, bytes], None]:
        while True:
            channel, data = await self._queue.get()
            if channel in self._channels:
                yield channel, data

    async def get_history(self, channel: str, limit: int | None = None) -> list[bytes]:
        return []  # wake-ups have no history: a reader catches up from the database


class Wakeups:
    """Tells other processes which tasks changed here, and hands their changes to `on_remote`.

    `publish` may be called from any thread; ids are gathered and sent once per loop turn."""

    def __init__(self, backend: ChannelsBackend, on_remote: Callable[[list[int]], None]) -> None:
        self.backend = backend
        self._plugin = ChannelsPlugin(backend=backend, channels=[CHANNEL])
        self._on_remote = on_remote
        self._origin = secrets.token_hex(6)
        self._pending: set[int] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._flush_scheduled = False
        self._reader: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        await self._plugin.__aenter__()
        subscriber = await self._plugin.subscribe([CHANNEL])
        self._reader = asyncio.create_task(self._read(subscriber.iter_events()), name="forgehand-wakeups")

    async def stop(self) -> None:
        loop, self._loop = self._loop, None
        if loop is None:
            return
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader
        await self._plugin.__aexit__(None, None, None)

    def publish(self, task_id: int) -> None:
        loop = self._loop
        if loop is None:
            return
        with contextlib.suppress(RuntimeError):  # the loop is closed: the process is stopping
            loop.call_soon_threadsafe(self._gather, task_id)

    def _gather(self, task_id: int) -> None:
        self._pending.add(task_id)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        ids, self._pending = sorted(self._pending), set()
        for start in range(0, len(ids), MAX_IDS):
            chunk = ",".join(str(i) for i in ids[start : start + MAX_IDS])
            self._plugin.publish(f"{self._origin}|{chunk}".encode(), CHANNEL)

    async def _read(self, events: AsyncGenerator[bytes, None]) -> None:
        """Hand other processes' ids on. Any role that may connect to the database may NOTIFY on
        the channel: a payload is parsed strictly (ASCII digits, at most MAX_IDS of them, the rest
        ignored), and nothing in it can stop the reading."""
        async for data in events:
            origin, _, ids = data.decode(errors="replace").partition("|")
            if origin == self._origin:
                continue
            found = [int(x) for x in ids.split(",")[:MAX_IDS] if x.isascii() and x.isdigit() and len(x) < 12]
            if not found:
                continue
            try:
                self._on_remote(found)
            except Exception:
                log.exception("handing on a wake-up failed")


def for_database(database_url: str, on_remote: Callable[[list[int]], None]) -> Wakeups | None:
    """The wake-ups of a database: PostgreSQL's `LISTEN/NOTIFY`; None on SQLite, whose one
    process wakes its own readers (tasks.core.live)."""
    if not database_url.startswith("postgresql"):
        return None
    return Wakeups(PgNotifyBackend(asyncpg_dsn(database_url)), on_remote)
