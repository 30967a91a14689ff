"""Run Alembic migrations from code (`forgehand db upgrade`, `forgehand serve`, tests)."""

import asyncio
from pathlib import Path

from alembic import command
from alembic.config import Config

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
