"""What every `forgehand` command needs: settings for a new or an existing instance (an existing
one's SQLite file is never created by mistake), the database, migrated, for one call (`run_db`),
the CLI's audit actor and a password prompt. Importing this module is cheap (click only)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from forge.core.settings import Settings
    from forge.db.audit import Actor
    from forge.db.engine import Database

T = TypeVar("T")


def cli_actor() -> Actor:
    from forge.db.audit import Actor

    return Actor.system("cli")


async def require_migrated(db: Database) -> None:
    """Commands other than `serve` (which migrates on start) and `db upgrade` need the schema."""
    from forge.db.migrate import current_revision, head_revision, is_known

    current, head = await current_revision(db.engine), head_revision()
    if current is not None and current != head and not is_known(current):
        raise click.ClickException(
            f"the database is at revision {current}, which a newer forgehand made (this one knows up to "
            f"{head}): run the newer release's forgehand"
        )
    if current != head:
        state = "has no forgehand tables yet" if current is None else f"is at revision {current}, not {head}"
        raise click.ClickException(f"the database {state}: run `forgehand db upgrade` first")


def _load(**overrides: Any) -> Settings:
    from forge.core.settings import load_settings

    given = {k: v for k, v in overrides.items() if v is not None}
    data_dir = click.get_current_context().find_root().params.get("data_dir")
    if data_dir is not None:
        given["data_dir"] = data_dir
    return load_settings(**given)


def start_settings(**overrides: Any) -> Settings:
    """Settings for the commands that start or create an instance (`serve`, `worker`, `db upgrade`):
    the data directory is created when missing."""
    from forge.core.settings import prepare_data_dir

    return prepare_data_dir(_load(**overrides))


def instance_settings() -> Settings:
    """Settings for the commands that work on an existing instance: when its SQLite database is not
    there, stop and say where we looked, creating nothing (no second, empty instance by mistake)."""
    from forge.core.settings import SettingsError, prepare_data_dir

    settings = _load()
    missing = _missing_sqlite_file(settings)
    if missing is not None:
        where = (
            f"{settings.data_dir} has no forgehand database ({missing.name})"
            if not settings.database_url
            else f"the database file {missing} does not exist (FORGEHAND_DATABASE_URL)"
        )
        raise SettingsError(
            f"{where}; nothing was created. Point the command at your instance's data directory with "
            "FORGEHAND_DATA_DIR=PATH or `forgehand --data-dir PATH ...` (`forgehand serve` prints it on start: "
            "`data: PATH`); to start a new instance there instead, run `forgehand db upgrade`"
        )
    return prepare_data_dir(settings)


def _missing_sqlite_file(settings: Settings) -> Path | None:
    if not settings.is_sqlite:
        return None
    path = settings.effective_database_url.split(":///", 1)[-1].split("?", 1)[0]
    if not path or path == ":memory:":
        return None
    file = Path(path)
    return None if file.is_file() else file.absolute()


def run_db(settings: Settings, fn: Callable[[Database], Awaitable[T]]) -> T:
    import asyncio

    from forge.db.engine import Database

    async def go() -> T:
        db = Database(settings.effective_database_url)
        try:
            await require_migrated(db)
            return await fn(db)
        finally:
            await db.dispose()

    return asyncio.run(go())


def prompt_twice(prompt: str) -> str:
    import getpass

    password = getpass.getpass(prompt)
    if getpass.getpass("again: ") != password:
        raise click.UsageError("the passwords differ")
    return password
