"""`forgehand db copy --to postgresql+asyncpg://...`: the instance's SQLite database copied, row for
row, into a new PostgreSQL database (the first step from one machine to several replicas).

The source (`<data>/forgehand.db` or FORGEHAND_DATABASE_URL) must be SQLite at this forgehand's
migration head. The target must be empty: no tables, only an empty `alembic_version`, or
forgehand's tables at head without rows (what `db upgrade` or a failed copy leaves); anything else
is refused, naming what was found. The target is migrated by the project's own migrations, then
every table of the models (forge's, the tasks', the webhooks') is copied in foreign-key order,
BATCH_ROWS at a time, ids kept: the source read in ONE read transaction (a consistent snapshot),
the target written in ONE transaction, so a refusal or failure half-way leaves it migrated and
empty and the copy can be run again. JSON goes over as its stored text (SQL NULL and JSON `null`
stay apart); datetimes, booleans and binary through their column types. A row referring to a
later row of its own table (a bot whose owner came after it) gets that column once the table is
in. What PostgreSQL refuses and SQLite stores (NUL in text, a string over its column's length, an
INTEGER out of range) is refused before it is written, naming table, column, row and the fix
(`--replace-nul` writes NUL as U+FFFD, as `forge.core.text.without_nul` does). Last, every
sequence is set past the largest copied id. The server must be stopped: what is written after the
snapshot is not in the target. Repositories, `secret_key` and `instance_id` stay in the data dir."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import click

from forge.app.commands.db_copy_checks import (
    CopyError,
    check_source,
    checked_target_url,
    describe,
    preflight,
    reason,
    target_engine,
    target_errors,
)

if TYPE_CHECKING:
    from sqlalchemy import Table
    from sqlalchemy.ext.asyncio import AsyncConnection
    from sqlalchemy.sql.dml import Insert
    from sqlalchemy.sql.elements import TextClause

#: Rows read and written at a time.
BATCH_ROWS = 1000
#: Every module that registers tables on `forge.db.engine.Base.metadata` (the list of
#: forge/db/migrations/env.py). Loaded by name: forge never imports the tasks and webhooks
#: packages in code (the import contracts).
MODEL_MODULES = (
    *("forge.db.models", "forge.db.issue_models", "forge.db.notify_models", "forge.db.secret_models"),
    *("tasks.core.models", "tasks.core.tool_models", "tasks.core.worker_models", "webhooks.core.models"),
)
NUL = "\x00"
REPLACEMENT = "\ufffd"
INT32 = (-(2**31), 2**31 - 1)

SEQUENCES = """
SELECT t.relname, a.attname
FROM pg_class s
JOIN pg_depend d ON d.objid = s.oid AND d.classid = 'pg_class'::regclass
    AND d.refclassid = 'pg_class'::regclass AND d.deptype IN ('a', 'i')
JOIN pg_class t ON t.oid = d.refobjid
JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = d.refobjsubid
WHERE s.relkind = 'S' AND s.relnamespace = to_regnamespace(current_schema())
ORDER BY 1, 2"""


# --- what is copied -------------------------------------------------------------------------------


def model_tables() -> list[Table]:
    """Every table of the models, parents before the tables that refer to them."""
    import importlib

    from forge.db.engine import Base

    for name in MODEL_MODULES:
        importlib.import_module(name)
    return list(Base.metadata.sorted_tables)


# --- the copy -----------------------------------------------------------------------------------


def _insert(table: Table) -> Insert:
    """An INSERT of every column; JSON columns take their stored text, cast to JSON."""
    from sqlalchemy import JSON, Text, bindparam, cast, insert

    values: dict[str, Any] = {}
    for i, column in enumerate(table.columns):
        if isinstance(column.type, JSON):
            values[column.name] = cast(bindparam(f"p{i}", type_=Text()), column.type)
        else:
            values[column.name] = bindparam(f"p{i}", type_=column.type)
    return insert(table).values(values)


@dataclass
class _TablePlan:
    """Copying one table's rows: which columns PostgreSQL checks, its references to itself, the
    parameters' names, the NULs replaced."""

    table: Table
    source: str
    replace_nul: bool
    texts: list[tuple[int, int | None]] = field(init=False)  # (column, its length) of strings and JSON
    ints: list[int] = field(init=False)  # 32-bit INTEGER columns
    self_references: list[tuple[int, int]] = field(init=False)  # (column, the column it refers to)
    names: list[str] = field(init=False)
    replaced: int = 0

    def __post_init__(self) -> None:
        from sqlalchemy import JSON, BigInteger, Integer, String

        columns = list(self.table.columns)
        self.texts = [
            (i, getattr(c.type, "length", None)) for i, c in enumerate(columns) if isinstance(c.type, (String, JSON))
        ]
        self.ints = [
            i for i, c in enumerate(columns) if isinstance(c.type, Integer) and not isinstance(c.type, BigInteger)
        ]
        self.self_references = [
            (columns.index(fk.parent), columns.index(fk.column))
            for fk in self.table.foreign_keys
            if fk.column.table is self.table
        ]
        self.names = [f"p{i}" for i in range(len(columns))]

    def params(self, row: tuple[Any, ...], later: list[tuple[int, int, Any]]) -> dict[str, Any]:
        """The INSERT's parameters for one row, checked; a reference to this row or a later one of
        the same table goes into `later` (rows go in primary key order) and is NULL until then."""
        values = list(row)
        for index, length in self.texts:
            value = values[index]
            if not isinstance(value, str):
                continue
            if NUL in value:
                if not self.replace_nul:
                    raise self.refusal(index, row, "holds a NUL character, which PostgreSQL cannot store", nul=True)
                values[index] = value = value.replace(NUL, REPLACEMENT)
                self.replaced += 1
            if length is not None and len(value) > length:
                raise self.refusal(index, row, f"is {len(value)} characters long, over its column's {length}")
        for index in self.ints:
            value = values[index]
            if isinstance(value, int) and not INT32[0] <= value <= INT32[1]:
                raise self.refusal(index, row, f"is {value}, outside PostgreSQL's INTEGER range")
        for index, referred in self.self_references:
            value = values[index]
            if value is not None and value >= values[referred]:
                later.append((index, values[referred], value))
                values[index] = None
        return dict(zip(self.names, values, strict=True))

    def refusal(self, index: int, row: tuple[Any, ...], problem: str, *, nul: bool = False) -> CopyError:
        columns = list(self.table.columns)
        keys = " AND ".join(f"{c.name} = {row[columns.index(c)]!r}" for c in self.table.primary_key.columns)
        if nul:
            fix = (
                "run `forgehand db copy` again with --replace-nul (each NUL in text becomes U+FFFD, as forgehand "
                f"writes the text it records), or edit the row in {self.source} first (server stopped)"
            )
        else:
            fix = f"edit the row in {self.source} (server stopped), then run `forgehand db copy` again"
        return CopyError(
            f"{self.table.name}.{columns[index].name} of the row {keys} {problem}: nothing was copied; {fix}"
        )


def _completion(conn: AsyncConnection, table: Table, index: int) -> TextClause:
    """UPDATE of one column by primary key, in SQL: a Core update() would also set the columns'
    `onupdate` values (an account's `updated_at`), which must stay as copied."""
    from sqlalchemy import text

    quote = conn.dialect.identifier_preparer.quote
    (key,) = table.primary_key.columns
    column = list(table.columns)[index].name
    return text(f"UPDATE {quote(table.name)} SET {quote(column)} = :p_value WHERE {quote(key.name)} = :p_key")  # noqa: S608


async def copy_table(src: AsyncConnection, dst: AsyncConnection, plan: _TablePlan) -> int:
    """The table's rows in primary key order, BATCH_ROWS at a time, then the references to later
    rows of the same table. Returns how many rows were copied."""
    from sqlalchemy import JSON, Text, select, type_coerce

    table = plan.table
    columns = [type_coerce(c, Text) if isinstance(c.type, JSON) else c for c in table.columns]
    statement = _insert(table)
    later: list[tuple[int, int, Any]] = []
    copied = 0
    result = await src.stream(select(*columns).order_by(*table.primary_key.columns))
    async for rows in result.partitions(BATCH_ROWS):
        await dst.execute(statement, [plan.params(tuple(row), later) for row in rows])
        copied += len(rows)
    for index in sorted({index for index, _, _ in later}):
        pairs = [{"p_key": key, "p_value": value} for i, key, value in later if i == index]
        for start in range(0, len(pairs), BATCH_ROWS):
            await dst.execute(_completion(dst, table, index), pairs[start : start + BATCH_ROWS])
    return copied


async def reset_sequences(conn: AsyncConnection) -> int:
    """Every sequence of a serial or identity column set so that its next value is max + 1."""
    from sqlalchemy import text

    quote = conn.dialect.identifier_preparer.quote
    owned = (await conn.execute(text(SEQUENCES))).all()
    for table, column in owned:
        following = f"COALESCE(max({quote(column)}), 0) + 1"  # names from the catalog, quoted
        statement = f"SELECT setval(pg_get_serial_sequence(:table, :column), {following}, false) FROM {quote(table)}"  # noqa: S608
        await conn.execute(text(statement), {"table": quote(table), "column": column})
    return len(owned)


async def copy_all(
    source: str, target: str, tables: list[Table], replace_nul: bool, on_table: Callable[[_TablePlan, int], None]
) -> int:
    """One read transaction on the source (a snapshot), one write transaction on the target.
    Returns the number of sequences reset."""
    from sqlalchemy.exc import DBAPIError

    from forge.db.engine import create_engine
    from forge.db.migrate import head_revision

    src, pg = create_engine(source), target_engine(target)
    try:
        async with src.connect() as s, s.begin():
            await check_source(s, tables, head_revision())  # again, inside the snapshot
            with target_errors(target, "writing to"):
                async with pg.connect() as d, d.begin():
                    for table in tables:
                        plan = _TablePlan(table, _sqlite_path(source), replace_nul)
                        try:
                            on_table(plan, await copy_table(s, d, plan))
                        except (DBAPIError, ValueError, TypeError) as exc:
                            why = reason(exc)
                            raise CopyError(f"copying {table.name} failed: {why}; nothing was copied") from None
                    return await reset_sequences(d)
    finally:
        await src.dispose()
        await pg.dispose()


# --- the command --------------------------------------------------------------------------------


def _sqlite_path(url: str) -> str:
    return url.split(":///", 1)[-1].split("?", 1)[0]


def _next_steps(source: str, target: str) -> None:
    from sqlalchemy.engine import make_url

    shown = make_url(target).render_as_string(hide_password=True).replace("***", "PASSWORD")
    click.echo(
        f"\nNext:\n  1. export FORGEHAND_DATABASE_URL={shown}  (the --to URL) for every forgehand process;\n"
        "     keep FORGEHAND_DATA_DIR: the repositories, secret_key and instance_id stay there\n"
        "  2. start the server: forgehand serve (replicas: docs/operator.md, 'Past one machine')\n"
        f"  3. keep {source} until the new instance is checked; never start forgehand on it again"
    )


@click.command("copy", short_help="Copy the SQLite database into a new, empty PostgreSQL database.")
@click.option(
    "--to",
    "target",
    required=True,
    metavar="URL",
    help="The new, empty PostgreSQL database (no tables, or only an empty alembic_version): "
    "postgresql+asyncpg://USER:PASSWORD@HOST/NAME.",
)
@click.option(
    "--replace-nul",
    is_flag=True,
    help="Write each NUL character in text as U+FFFD (PostgreSQL cannot store NUL; without this it is refused).",
)
def copy_command(target: str, replace_nul: bool) -> None:
    """Copy the instance's SQLite database (<data dir>/forgehand.db, or FORGEHAND_DATABASE_URL) into
    a new, empty PostgreSQL database: the target is migrated, every table's rows are copied with
    their ids, and its sequences are set past them.

    STOP THE SERVER (and every worker) FIRST: the copy reads one consistent snapshot, and whatever
    is written after it is not in the target. Then set FORGEHAND_DATABASE_URL to the target and
    start the server on the same data directory. A refusal or a failure copies nothing."""
    from forge.app.commands.context import instance_settings
    from forge.db.migrate import head_revision, upgrade

    settings = instance_settings()
    source = settings.effective_database_url
    if not settings.is_sqlite:
        raise CopyError(
            f"this instance's database is already PostgreSQL ({describe(source)}): `db copy` moves a SQLite "
            "instance; between PostgreSQL servers use pg_dump and pg_restore"
        )
    target, tables, head = checked_target_url(target), model_tables(), head_revision()
    started = time.monotonic()
    asyncio.run(preflight(source, target, tables, head))
    click.echo(f"copying {_sqlite_path(source)} (SQLite, revision {head}) into {describe(target)}")
    with target_errors(target, "migrating"):
        upgrade(target)
    migrated = time.monotonic()
    click.echo(f"migrated the target to {head} ({migrated - started:.1f} s)")
    totals = [0, 0, 0]  # tables, rows, NULs replaced

    def on_table(plan: _TablePlan, rows: int) -> None:
        totals[:] = [totals[0] + 1, totals[1] + rows, totals[2] + plan.replaced]
        replaced = f"  ({plan.replaced} with NUL replaced)" if plan.replaced else ""
        click.echo(f"  {plan.table.name:<28} {rows:>10,}{replaced}")

    sequences = asyncio.run(copy_all(source, target, tables, replace_nul, on_table))
    done = time.monotonic()
    click.echo(
        f"copied {totals[1]:,} rows in {totals[0]} tables in {done - migrated:.1f} s ({done - started:.1f} s in all); "
        f"{sequences} sequences set past the copied ids"
        + (f"; {totals[2]} text values with NUL written with U+FFFD" if totals[2] else "")
    )
    _next_steps(_sqlite_path(source), target)
