"""Two processes upgrading one fresh database at once (replicas starting together): one migrates
while the other waits for its lock, then finds the database at head. Every migration runs once and
both exit 0; without the lock the second failed (PostgreSQL: a duplicate type; SQLite: "database
is locked")."""

import fcntl
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import pytest
from alembic.script import ScriptDirectory
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from forge.db.migrate import MIGRATION_LOCK_KEY, alembic_config, head_revision, sqlite_lock_path
from tests.support import databases
from tests.support.waiting import until

UPGRADE = """
import logging, sys
logging.basicConfig(level=logging.INFO, format="%(name)s %(message)s")
from forge.db.migrate import upgrade
upgrade(sys.argv[1])
"""
WAITING = "waiting for another process's migrations"


@pytest.fixture
async def fresh_url(db_url: str, tmp_path: Path) -> str:
    """An empty database of the kind `db_url` is (never migrated)."""
    if db_url.startswith("postgresql"):
        return await databases.postgres_empty(os.environ["FORGEHAND_TEST_DATABASE_URL"])
    return f"sqlite+aiosqlite:///{tmp_path / 'fresh.db'}"


@asynccontextmanager
async def holding_the_lock(url: str) -> AsyncIterator[None]:
    """The lock an upgrade takes, held by the test: both processes are started and waiting on it
    before either migrates, however the machine schedules them."""
    if url.startswith("postgresql"):
        engine = create_async_engine(url, isolation_level="AUTOCOMMIT")
        try:
            async with engine.connect() as conn:
                await conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": MIGRATION_LOCK_KEY})
                yield
                await conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": MIGRATION_LOCK_KEY})
        finally:
            await engine.dispose()
        return
    with _flocked(sqlite_lock_path(url)):
        yield


@contextmanager
def _flocked(path: Path | None) -> Iterator[None]:
    assert path is not None
    with path.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


async def _alembic_versions(url: str) -> list[str]:
    engine = create_async_engine(url)
    try:
        async with engine.connect() as conn:
            return [r[0] for r in await conn.execute(text("SELECT version_num FROM alembic_version"))]
    finally:
        await engine.dispose()


async def test_two_processes_upgrading_at_once_migrate_once(fresh_url: str, tmp_path: Path) -> None:
    revisions = len(list(ScriptDirectory.from_config(alembic_config(fresh_url)).walk_revisions()))
    outputs = [tmp_path / f"upgrade-{i}.log" for i in (1, 2)]
    async with holding_the_lock(fresh_url):
        processes = []
        for out in outputs:
            with out.open("wb") as f:
                processes.append(
                    subprocess.Popen([sys.executable, "-c", UPGRADE, fresh_url], stdout=f, stderr=subprocess.STDOUT)
                )
        try:
            await until(
                lambda: (
                    all(WAITING in out.read_text() for out in outputs) or any(p.poll() is not None for p in processes)
                ),
                timeout=60,
                what="both processes to wait for the migration lock",
                show=lambda: [out.read_text()[-2000:] for out in outputs],
            )
        except BaseException:
            for p in processes:
                p.kill()
            raise
    codes = [p.wait(timeout=180) for p in processes]
    logs = [out.read_text() for out in outputs]
    assert codes == [0, 0], logs
    assert all(WAITING in log for log in logs), logs  # both were started before either migrated
    ran = [log.count("Running upgrade") for log in logs]
    assert sum(ran) == revisions and sorted(ran) == [0, revisions], logs  # one migrated, the other found head
    assert await _alembic_versions(fresh_url) == [head_revision()]
