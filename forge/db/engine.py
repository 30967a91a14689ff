"""Database engine and sessions.

SQLite runs in WAL mode with `busy_timeout` and foreign keys on. Writers open their transaction
with `BEGIN IMMEDIATE` so that two writers queue on the lock instead of failing half-way with
"database is locked" when a read transaction tries to upgrade. PostgreSQL needs none of this.
"""

import asyncio
import json
import time
import traceback
import weakref
from collections.abc import AsyncIterator, Callable, Hashable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

import msgspec
import structlog
from sqlalchemy import DateTime, MetaData, TypeDecorator, event
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.orm import DeclarativeBase

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

IMMEDIATE = "forgehand_immediate"
_AFTER_COMMIT = "forgehand_after_commit"

log = structlog.get_logger("forgehand.db")


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on every backend (SQLite stores no zone)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime stored; use forge.db.engine.utcnow()")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def utcnow() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
    type_annotation_map = {datetime: UTCDateTime()}


def _install_sqlite_hooks(engine: AsyncEngine) -> None:
    sync_engine = engine.sync_engine

    @event.listens_for(sync_engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Let SQLAlchemy (not the driver) issue BEGIN, so we can choose IMMEDIATE.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA busy_timeout=15000")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.close()

    @event.listens_for(sync_engine, "begin")
    def _on_begin(conn: Any) -> None:
        immediate = conn.get_execution_options().get(IMMEDIATE, False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


#: How long a write waits for a pooled connection before it is answered 503 with Retry-After
#: (`forge.http.problems`): a full pool is back-pressure, not a server error after 30 s.
POOL_TIMEOUT_SECONDS = 5.0
#: How long a read waits for one. Reads never queue behind writes (a pool of their own), so a
#: full read pool is only many reads in flight, each soon done: 300 at once on two CPUs take
#: 10-20 s in all, and every one is answered rather than the late ones refused 503.
READ_POOL_TIMEOUT_SECONDS = 30.0
#: The read pool (`Database.engine`). Writes have a pool of their own (`Database.write_engine`):
#: a burst of writes queued on SQLite's one write lock, or PostgreSQL's row locks, never takes the
#: connections reads need (in WAL mode SQLite readers go on while a writer writes).
POOL_SIZE = 10
POOL_MAX_OVERFLOW = 10
#: SQLite has one writer at a time (and writers queue in-process first, `Database._write_turn`):
#: a connection or two is all its writes can use. PostgreSQL writers run side by side.
SQLITE_WRITE_POOL = 2
WRITE_POOL_SIZE = 5
WRITE_POOL_MAX_OVERFLOW = 5
#: How long a read path's bookkeeping write (`Database.touch`) may wait before it is skipped.
TOUCH_SECONDS = 1.0
#: A SQLite write transaction held longer than this is logged (every other writer waited for it).
SLOW_WRITE_SECONDS = 1.0

#: How long a SQLite writer waits for its turn (the engine's `busy_timeout`) before the same 503.
WRITE_TURN_SECONDS = 15.0


def json_text(value: Any) -> str:
    """The JSON columns' serializer. msgspec, not `json.dumps` (several times faster on the
    transcript's write path); a value already encoded (`msgspec.Raw`: a transcript payload whose
    text redaction looked at) goes in as it is; what msgspec refuses (a string with a lone
    surrogate) is written by `json.dumps`, as before."""
    if isinstance(value, msgspec.Raw):
        return bytes(value).decode()
    try:
        return msgspec.json.encode(value).decode()
    except (TypeError, ValueError, UnicodeError):  # msgspec.EncodeError is a ValueError
        return json.dumps(value)


def create_engine(url: str, *, write: bool = False) -> AsyncEngine:
    """The read engine, or with `write` the engine of write transactions (a pool of its own)."""
    size, overflow = (WRITE_POOL_SIZE, WRITE_POOL_MAX_OVERFLOW) if write else (POOL_SIZE, POOL_MAX_OVERFLOW)
    if write and url.startswith("sqlite"):
        size, overflow = SQLITE_WRITE_POOL, 0
    wait = POOL_TIMEOUT_SECONDS if write else READ_POOL_TIMEOUT_SECONDS
    pool = {"pool_size": size, "max_overflow": overflow, "pool_timeout": wait}
    if url.startswith("sqlite"):
        engine = create_async_engine(url, connect_args={"timeout": 15}, json_serializer=json_text, **pool)
        _install_sqlite_hooks(engine)
        return engine
    return create_async_engine(url, pool_pre_ping=True, json_serializer=json_text, **pool)


def after_commit(session: AsyncSession, key: Hashable, fn: Callable[[], None]) -> None:
    """Run `fn` once the session's current transaction has committed; drop it on rollback.

    For effects that must follow a commit and never precede it (waking a worker or a live view:
    woken early, it reads the old rows and sleeps again). One `key` registers once per transaction,
    so ten events of one task wake its readers once. `fn` runs on the committing thread; an error
    in it is logged, never raised (the commit has happened)."""
    info = session.info
    if _AFTER_COMMIT not in info:
        info[_AFTER_COMMIT] = {}
        sync = session.sync_session
        event.listen(sync, "after_commit", _run_after_commit)
        event.listen(sync, "after_rollback", _drop_after_commit)
    info[_AFTER_COMMIT].setdefault(key, fn)


def _run_after_commit(sync_session: Any) -> None:
    hooks: dict[Hashable, Callable[[], None]] = sync_session.info.get(_AFTER_COMMIT, {})
    pending = list(hooks.values())
    hooks.clear()
    for fn in pending:
        try:
            fn()
        except Exception:
            log.exception("an after-commit hook failed")


def _drop_after_commit(sync_session: Any) -> None:
    sync_session.info.get(_AFTER_COMMIT, {}).clear()


class Database:
    """Engine plus session factories; one per process."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = create_engine(url)  # reads
        self.write_engine = create_engine(url, write=True)
        self.sessionmaker = async_sessionmaker(self.engine, expire_on_commit=False)
        self.write_sessionmaker = async_sessionmaker(self.write_engine, expire_on_commit=False)
        # SQLite writers queue in-process, before taking a pooled connection: queued on the
        # database's lock instead, each would sit on a connection for up to `busy_timeout`, and a
        # burst of writes would starve every read of the pool. One lock per event loop.
        self._turns: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] | None = (
            weakref.WeakKeyDictionary() if url.startswith("sqlite") else None
        )

    @asynccontextmanager
    async def _write_turn(self, write: bool) -> AsyncIterator[None]:
        if not write or self._turns is None:
            yield
            return
        lock = self._turns.setdefault(asyncio.get_running_loop(), asyncio.Lock())
        try:
            async with asyncio.timeout(WRITE_TURN_SECONDS):
                await lock.acquire()
        except TimeoutError:
            raise PoolTimeout(f"no write turn within {WRITE_TURN_SECONDS:.0f} s") from None
        taken = time.monotonic()
        try:
            yield
        finally:
            lock.release()
            held = time.monotonic() - taken
            if held > SLOW_WRITE_SECONDS:
                # every other writer of this process waited as long: name the holder
                frames = traceback.extract_stack(limit=12)
                where = [f"{f.filename}:{f.lineno} {f.name}" for f in frames if "contextlib" not in f.filename]
                log.warning("a write transaction held the write turn", seconds=round(held, 2), where=where[-5:-2])

    @asynccontextmanager
    async def session(self, *, write: bool = False) -> AsyncIterator[AsyncSession]:
        """A session whose transaction commits on success and rolls back on error.

        `write=True` takes SQLite's write lock up front (BEGIN IMMEDIATE), after its turn among
        this process's writers, on a connection of the write pool; a read never waits for one.
        What `after_commit` registered on it runs once it has committed."""
        makers = self.write_sessionmaker if write else self.sessionmaker
        async with self._write_turn(write), makers() as session:
            if write:
                await session.connection(execution_options={IMMEDIATE: True})
            try:
                yield session
                await session.commit()
            except BaseException:
                await session.rollback()
                raise

    async def touch(self, statement: Any, *, within: float = TOUCH_SECONDS) -> None:
        """A bookkeeping write a read path makes (a token's or a session's last use): done if the
        write path has room within `within` seconds, else skipped, so that a read never waits on
        (or fails with) the write path."""
        try:
            async with asyncio.timeout(within), self.session(write=True) as session:
                await session.execute(statement)
        except (TimeoutError, PoolTimeout, OperationalError) as exc:
            log.info("bookkeeping write skipped: the write path is busy", error=type(exc).__name__)

    async def dispose(self) -> None:
        await self.engine.dispose()
        await self.write_engine.dispose()
