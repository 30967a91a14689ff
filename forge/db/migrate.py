"""Run Alembic migrations from code (`forgehand db upgrade`, `forgehand serve`, tests)."""

import asyncio
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.ext.asyncio import AsyncEngine

MIGRATIONS = Path(__file__).parent / "migrations"


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    cfg.set_main_option("path_separator", "os")
    cfg.set_main_option("version_locations", str(MIGRATIONS / "versions"))
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    """Upgrade the database; blocking (env.py runs its own event loop)."""
    command.upgrade(alembic_config(url), revision)


async def upgrade_async(url: str, revision: str = "head") -> None:
    # env.py calls asyncio.run, which cannot nest inside a running loop: use a thread.
    await asyncio.to_thread(upgrade, url, revision)


def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()


async def current_revision(engine: AsyncEngine) -> str | None:
    """The revision the database is at (None: never migrated)."""
    async with engine.connect() as conn:
        return await conn.run_sync(lambda sync: MigrationContext.configure(sync).get_current_revision())
