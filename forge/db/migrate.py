"""Run Alembic migrations from code (`forgehand db upgrade`, `forgehand serve`, tests).

Several processes may start on one database at once (replicas behind a load balancer, `serve` and
`worker` started together): each upgrade holds a lock for its whole length (`migration_lock`, taken
by env.py), so the first migrates and the others wait, then find the database at head and do
nothing. Without it both ran the same migrations: on PostgreSQL the second failed on a duplicate
type or table, on SQLite with "database is locked" (in WAL mode a deferred transaction that read
before another process's write cannot then write: its busy timeout does not help it)."""

import asyncio
import fcntl
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import structlog
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util.exc import CommandError
from sqlalchemy import URL, make_url, text
from sqlalchemy.ext.asyncio import AsyncEngine

MIGRATIONS = Path(__file__).parent / "migrations"

#: The PostgreSQL advisory lock an upgrade holds ("forgehnd" as a 64-bit integer). Session-level,
#: on a connection of its own: it lasts across the migrations' transactions, and ends with the
#: connection if the process dies.
MIGRATION_LOCK_KEY = 0x666F_7267_6568_6E64

log = structlog.get_logger("forgehand.db")


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    cfg.set_main_option("path_separator", "os")
    cfg.set_main_option("version_locations", str(MIGRATIONS / "versions"))
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    """Upgrade the database; blocking (env.py runs its own event loop).

    A database a newer release already migrated (a revision this release does not know) is left
    as it is, with a warning: during a rolling upgrade a replica of the previous release that
    restarts keeps serving on it, as one that kept running does (migrations expand first,
    docs/operator.md, "Upgrading"), instead of failing to start."""
    try:
        command.upgrade(alembic_config(url), revision)
    except CommandError as exc:
        newer = unknown_revision(exc)
        if newer is None:
            raise
        log.warning(
            "the database was migrated by a newer forgehand: running on it as it is",
            database_revision=newer,
            this_release_head=head_revision(),
            fix="replace this process with the newer release",
        )


def unknown_revision(exc: CommandError) -> str | None:
    """The revision named by Alembic's "Can't locate revision" error (a newer release's), or None."""
    match = re.search(r"Can't locate revision identified by '([^']+)'", str(exc))
    return match.group(1) if match else None


def is_known(revision: str) -> bool:
    """Whether `revision` is one of this release's migrations."""
    script = ScriptDirectory.from_config(alembic_config("sqlite://"))
    return any(r.revision == revision for r in script.walk_revisions())


async def upgrade_async(url: str, revision: str = "head") -> None:
    # env.py calls asyncio.run, which cannot nest inside a running loop: use a thread.
    await asyncio.to_thread(upgrade, url, revision)


def sqlite_lock_path(url: str | URL) -> Path | None:
    """The file beside a SQLite database whose lock an upgrade holds (None: an in-memory database)."""
    database = make_url(url).database
    if not database or database == ":memory:" or database.startswith("file:"):
        return None
    return Path(f"{database}.migrate.lock")


@asynccontextmanager
async def migration_lock(engine: AsyncEngine) -> AsyncIterator[None]:
    """Held around one process's whole upgrade: others wait for it (logged when they do)."""
    if engine.dialect.name == "postgresql":
        async with engine.connect() as conn:
            conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
            key = {"key": MIGRATION_LOCK_KEY}
            if not (await conn.execute(text("SELECT pg_try_advisory_lock(:key)"), key)).scalar_one():
                log.info("waiting for another process's migrations", lock=f"pg_advisory_lock({MIGRATION_LOCK_KEY})")
                await conn.execute(text("SELECT pg_advisory_lock(:key)"), key)
            try:
                yield
            finally:
                await conn.execute(text("SELECT pg_advisory_unlock(:key)"), key)
        return
    path = sqlite_lock_path(engine.url) if engine.dialect.name == "sqlite" else None
    if path is None:
        yield
        return
    # An fcntl lock: released by the kernel when the process ends, however it ends.
    with path.open("a") as lock_file:
        try:
            fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("waiting for another process's migrations", lock=str(path))
            await asyncio.to_thread(fcntl.flock, lock_file, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock_file, fcntl.LOCK_UN)


def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()


async def current_revision(engine: AsyncEngine) -> str | None:
    """The revision the database is at (None: never migrated)."""
    async with engine.connect() as conn:
        return await conn.run_sync(lambda sync: MigrationContext.configure(sync).get_current_revision())
