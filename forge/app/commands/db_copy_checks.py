"""The checks and the target of `forgehand db copy` (forge/app/commands/db_copy.py): the target's
URL and engine, its errors as one line, and what is refused before anything is written (a source
not at head or with unknown tables, a target that is not empty)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from sqlalchemy import Table
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

#: How long connecting to the target may take, and one statement on it.
CONNECT_TIMEOUT_SECONDS = 10.0
STATEMENT_TIMEOUT_SECONDS = 600.0
VERSION_TABLE = "alembic_version"
NEW_DATABASE = "copy into a new, empty database (`createdb -O USER NAME`, then `--to` naming it)"


class CopyError(click.ClickException):
    """An expected refusal or failure: one line on stderr, exit status 2."""

    exit_code = 2

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"forgehand: error: {self.format_message()}", err=True)


def describe(url: str) -> str:
    """The target as a message names it: never its password."""
    from sqlalchemy.engine import make_url

    u = make_url(url)
    return f"database {u.database!r} on {u.host or 'localhost'}:{u.port or 5432}"


def checked_target_url(url: str) -> str:
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        database = make_url(url).database if url.startswith("postgresql+asyncpg://") else None
    except (ArgumentError, ValueError):
        database = None
    if not database:
        scheme = url.split("://", 1)[0] if "://" in url else "no URL"
        raise CopyError(f"--to: expected postgresql+asyncpg://USER:PASSWORD@HOST/NAME, got {scheme!r}")
    return url


def target_engine(url: str) -> AsyncEngine:
    from sqlalchemy.ext.asyncio import create_async_engine
    from sqlalchemy.pool import NullPool

    timeouts = {"timeout": CONNECT_TIMEOUT_SECONDS, "command_timeout": STATEMENT_TIMEOUT_SECONDS}
    return create_async_engine(url, poolclass=NullPool, connect_args=timeouts)


def reason(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None) or exc
    text = str(orig).strip() or type(orig).__name__
    return text.splitlines()[0]


@contextmanager
def target_errors(url: str, doing: str) -> Iterator[None]:
    """The target's connection and server errors as one line naming the target."""
    from asyncpg import InterfaceError, PostgresError
    from sqlalchemy.exc import DBAPIError

    hint = " (check the --to URL; the database must exist: `createdb -O USER NAME`)" if doing == "connecting to" else ""
    try:
        yield
    except (OSError, DBAPIError, PostgresError, InterfaceError) as exc:
        raise CopyError(f"{doing} {describe(url)} failed: {reason(exc)}{hint}") from None


# --- the checks ---------------------------------------------------------------------------------


async def check_source(conn: AsyncConnection, tables: list[Table], head: str | None) -> None:
    """The source is at this forgehand's head and holds no table the models do not describe."""
    from alembic.runtime.migration import MigrationContext
    from sqlalchemy import text

    revision = await conn.run_sync(lambda sync: MigrationContext.configure(sync).get_current_revision())
    if revision != head:
        state = "has no forgehand tables" if revision is None else f"is at revision {revision}, not {head}"
        raise CopyError(f"the SQLite database {state}: run `forgehand db upgrade` first (server stopped), then copy")
    query = "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
    present = {row[0] for row in await conn.execute(text(query))}
    unknown = sorted(present - {t.name for t in tables} - {VERSION_TABLE})
    if unknown:
        raise CopyError(f"the SQLite database has tables this forgehand's models do not describe: {', '.join(unknown)}")


async def target_contents(conn: AsyncConnection) -> tuple[set[str], list[str], str | None]:
    """The target's tables, those of them holding rows, and its migration revision."""
    from sqlalchemy import text

    query = "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
    tables = {row[0] for row in await conn.execute(text(query))}
    quote = conn.dialect.identifier_preparer.quote
    filled = []
    for name in sorted(tables):
        if (await conn.execute(text(f"SELECT EXISTS (SELECT 1 FROM {quote(name)})"))).scalar_one():  # noqa: S608
            filled.append(name)
    revision = None
    if VERSION_TABLE in filled:
        revision = (await conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}"))).scalar()  # noqa: S608
        filled.remove(VERSION_TABLE)
    return tables, filled, revision


def refuse_used_target(
    url: str, tables: set[str], filled: list[str], revision: str | None, known: set[str], head: str | None
) -> None:
    """Empty: no tables, only an empty alembic_version, or forgehand's tables at head, all empty."""
    foreign = sorted(tables - known - {VERSION_TABLE})
    found = None
    if foreign:
        found = f"it has tables that are not forgehand's ({_some(foreign)})"
    elif filled:
        found = f"it is not empty, {_some(filled)} already hold rows"
    elif revision not in (None, head) or (revision is None and tables - {VERSION_TABLE}):
        found = f"it has forgehand's tables at {f'revision {revision}' if revision else 'no revision'}, not {head}"
    if found:
        raise CopyError(f"refusing to copy into {describe(url)}: {found}: {NEW_DATABASE}")


def _some(names: list[str], limit: int = 8) -> str:
    more = len(names) - limit
    return ", ".join(names[:limit]) + (f" and {more} more" if more > 0 else "")


async def preflight(source: str, target: str, tables: list[Table], head: str | None) -> None:
    """The source's revision and tables, then the target's emptiness: before anything is written."""
    from forge.db.engine import create_engine

    engine = create_engine(source)
    try:
        async with engine.connect() as conn:
            await check_source(conn, tables, head)
    finally:
        await engine.dispose()
    pg = target_engine(target)
    try:
        with target_errors(target, "connecting to"):
            async with pg.connect() as conn:
                found = await target_contents(conn)
    finally:
        await pg.dispose()
    refuse_used_target(target, *found, known={t.name for t in tables}, head=head)
