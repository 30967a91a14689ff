"""Test databases, each a copy of one migrated template so no test pays for the migrations.

SQLite: the migrations run once per test process into a template file; a test gets a copy of it.
PostgreSQL (`FORGEHAND_TEST_DATABASE_URL`): that database is only the maintenance connection.
Each test process (each xdist worker: `gw0`, `gw1`, ...; `main` without xdist) migrates its own
template database `<name>_<worker>_tmpl` once, and a test gets `<name>_<worker>`, dropped and
created again from the template (`CREATE DATABASE ... TEMPLATE`, about 0.1 s where dropping the
schema and migrating took over a second). Workers never share a database."""

import asyncio
import os
import shutil
import threading
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine

from forge.migrate import upgrade_async

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


def _postgres_template(admin_url: str) -> str:
    """The name of this process's migrated template database, made once."""
    with _lock:
        if admin_url not in _templates:
            base = make_url(admin_url)
            name = f"{base.database}_{worker_name()}_tmpl"
            url = base.set(database=name).render_as_string(hide_password=False)

            async def make() -> None:
                await _execute(admin_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)', f'CREATE DATABASE "{name}"')
                await upgrade_async(url)

            _run(make)
            _templates[admin_url] = name
        return _templates[admin_url]


async def postgres_copy(admin_url: str) -> str:
    """A fresh copy of the template for one test; the previous test's copy is dropped (its leftover
    connections with it)."""
    template = await asyncio.to_thread(_postgres_template, admin_url)
    base = make_url(admin_url)
    name = f"{base.database}_{worker_name()}"
    await _execute(
        admin_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)', f'CREATE DATABASE "{name}" TEMPLATE "{template}"'
    )
    return base.set(database=name).render_as_string(hide_password=False)
