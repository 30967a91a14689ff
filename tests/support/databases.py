"""Test databases, each a copy of one migrated template so no test pays for the migrations.

SQLite: the migrations run once per test process into a template file; a test gets a copy of it.
PostgreSQL (`FORGEHAND_TEST_DATABASE_URL`): that database is only the maintenance connection.
Each test process (each xdist worker: `gw0`, `gw1`, ...; `main` without xdist) migrates its own
template database `<name>_<worker>_template` once, and a test gets `<name>_<worker>_<n>`, made
from the template (`CREATE DATABASE ... TEMPLATE`, about 0.1 s where dropping the schema and
migrating took over a second) and dropped when the next test starts. Workers never share a
database."""

import asyncio
import itertools
import os
import shutil
import threading
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import create_async_engine

from forge.db.migrate import upgrade_async

_templates: dict[str, str] = {}
_lock = threading.Lock()


def worker_name() -> str:
    """This test process's xdist worker id (`gw0`...), or `main` without xdist."""
    return os.environ.get("PYTEST_XDIST_WORKER", "") or "main"


def _run(coro_fn: object) -> None:
    # A thread of its own: the caller may be inside a running loop (a test's, or Playwright's).
    errors: list[BaseException] = []

    def target() -> None:
        try:
            asyncio.run(coro_fn())  # type: ignore[operator]
        except BaseException as exc:  # handed to the caller
            errors.append(exc)

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    if errors:
        raise errors[0]


def sqlite_template(directory: Path) -> Path:
    """A migrated SQLite file under `directory`, made once per process."""
    with _lock:
        if "sqlite" not in _templates:
            path = directory / "template.db"
            _run(lambda: upgrade_async(f"sqlite+aiosqlite:///{path}"))
            _templates["sqlite"] = str(path)
        return Path(_templates["sqlite"])


def sqlite_copy(template: Path, target: Path) -> str:
    shutil.copyfile(template, target)
    return f"sqlite+aiosqlite:///{target}"


async def _execute(admin_url: str, *statements: str) -> None:
    engine = create_async_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        async with engine.connect() as conn:
            for statement in statements:
                await conn.execute(text(statement))
    finally:
        await engine.dispose()


async def _names_with_prefix(admin_url: str, prefix: str) -> list[str]:
    engine = create_async_engine(admin_url)
    try:
        async with engine.connect() as conn:
            rows = await conn.execute(
                text("SELECT datname FROM pg_database WHERE left(datname, :n) = :p"), {"n": len(prefix), "p": prefix}
            )
            return [r[0] for r in rows]
    finally:
        await engine.dispose()


async def _drop(admin_url: str, name: str) -> bool:
    """Drop a copy and its leftover connections; False when it cannot be dropped yet (an
    autovacuum worker, which only a superuser may end, is at work in it): tried again later."""
    try:
        await _execute(admin_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    except DBAPIError:
        return False
    return True


def _prefix(admin_url: str) -> str:
    return f"{make_url(admin_url).database}_{worker_name()}_"


def _postgres_template(admin_url: str) -> str:
    """The name of this process's migrated template database, made once (what an earlier run of
    this worker left is dropped first). It takes no connections once migrated, so no autovacuum
    worker can hold it while a copy is made."""
    with _lock:
        if admin_url not in _templates:
            prefix = _prefix(admin_url)
            name = prefix + "template"
            url = make_url(admin_url).set(database=name).render_as_string(hide_password=False)

            async def make() -> None:
                for old in await _names_with_prefix(admin_url, prefix):
                    await _execute(admin_url, f'ALTER DATABASE "{old}" ALLOW_CONNECTIONS true')
                    await _drop(admin_url, old)
                await _execute(admin_url, f'CREATE DATABASE "{name}"')
                await upgrade_async(url)
                await _execute(admin_url, f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')

            _run(make)
            _templates[admin_url] = name
        return _templates[admin_url]


_copies = itertools.count()
_undropped: list[str] = []


async def postgres_copy(admin_url: str) -> str:
    """A fresh copy of the template for one test, under a name of its own; the copies of earlier
    tests are dropped (their leftover connections with them)."""
    template = await asyncio.to_thread(_postgres_template, admin_url)
    for old in list(_undropped):
        if await _drop(admin_url, old):
            _undropped.remove(old)
    name = f"{_prefix(admin_url)}{next(_copies)}"
    await _execute(admin_url, f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    _undropped.append(name)
    return make_url(admin_url).set(database=name).render_as_string(hide_password=False)


async def postgres_empty(admin_url: str) -> str:
    """A new, empty database (never migrated) for one test, dropped with the copies (a test of the
    migrations themselves)."""
    # The process id in the name: two test processes on one maintenance database (a worker of
    # each has the same xdist name) never meet on an empty database.
    name = f"{_prefix(admin_url)}empty_{os.getpid()}_{next(_copies)}"
    await _execute(admin_url, f'CREATE DATABASE "{name}"')
    _undropped.append(name)
    return make_url(admin_url).set(database=name).render_as_string(hide_password=False)
