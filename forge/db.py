"""Database engine and sessions.

SQLite runs in WAL mode with `busy_timeout` and foreign keys on. Writers open their transaction
with `BEGIN IMMEDIATE` so that two writers queue on the lock instead of failing half-way with
"database is locked" when a read transaction tries to upgrade. PostgreSQL needs none of this.
"""

import asyncio
import json
import weakref
from collections.abc import AsyncIterator, Callable, Hashable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

import msgspec
import structlog
from sqlalchemy import DateTime, MetaData, TypeDecorator, event
from sqlalchemy.engine import Dialect
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
            raise ValueError("naive datetime stored; use forge.db.utcnow()")
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


#: How long a request waits for a pooled connection before it is answered 503 with Retry-After
#: (`forge.problems`): a full pool is back-pressure, not a server error after 30 s.
POOL_TIMEOUT_SECONDS = 5.0
POOL_SIZE = 10
POOL_MAX_OVERFLOW = 10
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


def create_engine(url: str) -> AsyncEngine:
    pool = {"pool_size": POOL_SIZE, "max_overflow": POOL_MAX_OVERFLOW, "pool_timeout": POOL_TIMEOUT_SECONDS}
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
        self.engine = create_engine(url)
        self.sessionmaker = async_sessionmaker(self.engine, expire_on_commit=False)
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
        try:
            yield
        finally:
            lock.release()

    @asynccontextmanager
    async def session(self, *, write: bool = False) -> AsyncIterator[AsyncSession]:
        """A session whose transaction commits on success and rolls back on error.

        `write=True` takes SQLite's write lock up front (BEGIN IMMEDIATE), after its turn among
        this process's writers. What `after_commit` registered on it runs once it has committed."""
        async with self._write_turn(write), self.sessionmaker() as session:
            if write:
                await session.connection(execution_options={IMMEDIATE: True})
            try:
                yield session
                await session.commit()
            except BaseException:
                await session.rollback()
                raise

    async def dispose(self) -> None:
        await self.engine.dispose()
