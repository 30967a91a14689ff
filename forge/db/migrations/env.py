"""Alembic environment: async engines for SQLite (aiosqlite) and PostgreSQL (asyncpg)."""

import asyncio
from typing import Any

from alembic import context
from sqlalchemy import event
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine

from forge.db import issue_models, models, notify_models, secret_models  # noqa: F401  (registers the tables on the metadata)
from forge.db.engine import Base, create_engine
from forge.db.migrate import migration_lock

config = context.config
target_metadata = Base.metadata


def _include_models() -> None:
    # The task and webhook packages register their tables on the same metadata (autogenerate
    # compares all of them). Imported by name: forge sits below them and never imports them in
    # code (the import contracts); this is the one place that needs every table at once.
    import importlib

    for name in ("tasks.core.models", "tasks.core.tool_models", "tasks.core.worker_models", "webhooks.core.models"):
        importlib.import_module(name)


_include_models()


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def _sqlite_keys_off(engine: AsyncEngine) -> None:
    """On SQLite, migrations run with foreign keys off: a batch operation copies a table and drops
    the old one, and with foreign keys on that drop deletes (ON DELETE CASCADE) every row that
    refers to it. They are checked once the migrations ran (`_check_keys`)."""

    @event.listens_for(engine.sync_engine, "connect")
    def _off(dbapi_conn: Any, _record: Any) -> None:
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA foreign_keys=OFF")
        cur.close()


def _check_keys(connection: Connection) -> None:
    broken = connection.exec_driver_sql("PRAGMA foreign_key_check").fetchall()
    if broken:
        raise RuntimeError(f"the migrations left {len(broken)} rows whose foreign keys point nowhere: {broken[:5]}")


async def _run_async(url: str) -> None:
    engine = create_engine(url)
    sqlite = engine.dialect.name == "sqlite"
    if sqlite:
        _sqlite_keys_off(engine)
    try:
        # One process migrates at a time; the next finds the database at head (forge/db/migrate.py).
        async with migration_lock(engine), engine.connect() as connection:
            await connection.run_sync(_run)
            if sqlite:
                await connection.run_sync(_check_keys)
            await connection.commit()
    finally:
        await engine.dispose()


def run_migrations_offline() -> None:
    context.configure(url=config.get_main_option("sqlalchemy.url"), target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    asyncio.run(_run_async(str(config.get_main_option("sqlalchemy.url"))))
