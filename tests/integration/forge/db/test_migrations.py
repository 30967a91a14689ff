"""Migrations: up from empty, idempotent, and in step with the models (no pending autogenerate diff)."""

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect

from forge.db.engine import Base, Database
from forge.db.migrate import upgrade_async


async def test_upgrade_from_empty_creates_every_table(db: Database, db_url: str) -> None:
    await upgrade_async(db_url)  # a second run is a no-op
    async with db.engine.connect() as conn:
        tables = await conn.run_sync(lambda c: set(inspect(c).get_table_names()))
    assert {"accounts", "access_tokens", "web_sessions", "audit_events", "alembic_version"} <= tables


async def test_models_and_migrations_agree(db: Database) -> None:
    def diff(sync_conn: object) -> list[object]:
        ctx = MigrationContext.configure(sync_conn, opts={"compare_type": True})  # type: ignore[arg-type]
        return list(compare_metadata(ctx, Base.metadata))

    async with db.engine.connect() as conn:
        changes = await conn.run_sync(diff)
    assert changes == []
