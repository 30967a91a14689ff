"""`forgehand backup DEST` and `forgehand restore SRC --data-dir NEW`: a whole instance (its
database, its bare repositories and the data-dir files that must travel with them) in one archive
directory, and back into a fresh data directory and a fresh database.

The archive is a directory (tar it, copy it, rsync it as you like; `restore` reads the directory):

    DEST/manifest.json        format, forgehand version, Alembic revision, time, database kind, counts
    DEST/database.sqlite3     SQLite: a page-for-page copy made with the online backup API
    DEST/database.pgdump      PostgreSQL: `pg_dump --format=custom`
    DEST/data/repos/...       the bare repositories (<owner>/<name>.git)
    DEST/data/push-journal/   pushes in flight when the copy was made (recorded when the restored
                              instance starts, as after a crash)
    DEST/data/secret_key      the key that seals model keys and repository secrets (when it is a file)
    DEST/data/instance_id     the instance's identity (webhook `iss`; when it is a file)

It is written as `DEST.partial` and renamed to DEST once complete: a DEST that exists is whole.

Consistency, while the server runs. Git and the database are two stores; the database names
commits (a task's head, a merge, a pull request's head) that must exist in the repositories.
So the DATABASE IS SNAPSHOT FIRST, THE REPOSITORIES ARE COPIED SECOND: git objects are append-only,
so every object the snapshot names is already on disk when the copy starts and is in the copy.
Objects written later are harmless extras. Refs are the only mutable part of a repository; a ref
that moved after the snapshot (a push or merge during the backup) is newer in the copy than the
database says: the restored instance holds that commit, its database has no record of the push
(and a push still in flight is in the copied push journal, recorded when the restored instance
starts). The restored instance is consistent as of the database snapshot, plus those newer refs.
(The other order would be worse: a database newer than the repositories names commits that are
not there.) Within one repository, its refs are read before its objects are copied, so every
copied ref points at an object that is in the copy.

PostgreSQL: the counts, the revision and `pg_dump` read one exported snapshot
(`pg_export_snapshot`, `pg_dump --snapshot`), so the manifest describes exactly the dump. The
password goes to pg_dump/pg_restore in PGPASSWORD, never on the command line."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from forge.core.settings import Settings

FORMAT = 1
MANIFEST = "manifest.json"
SQLITE_FILE = "database.sqlite3"
PG_FILE = "database.pgdump"
DATA = "data"
INSTANCE_FILES = ("secret_key", "instance_id")
# Tables counted into the manifest (those the schema has): what an operator checks a restore by.
COUNTED = (
    "accounts",
    "repositories",
    "pull_requests",
    "issues",
    "tasks",
    "task_runs",
    "transcript_events",
    "repo_secrets",
    "model_keys",
)
# Parts of a bare repository never copied: lock files of writes in progress, push quarantines.
_SKIP_SUFFIXES = (".lock",)
_QUARANTINES = ("incoming-", "tmp_objdir-")
_REF_PARTS = ("HEAD", "packed-refs", "refs")


class BackupError(click.ClickException):
    """An expected failure: one line on stderr, exit status 2."""

    exit_code = 2

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"forgehand: error: {self.format_message()}", err=True)


# --- shared ------------------------------------------------------------------------------------


def _sqlite_path(settings: Settings) -> Path:
    return Path(settings.effective_database_url.split(":///", 1)[-1].split("?", 1)[0])


def _pg_env(url: str) -> dict[str, str]:
    """libpq's environment for the URL: the password in PGPASSWORD, never in argv."""
    from sqlalchemy.engine import make_url

    u = make_url(url)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    for key, value in (
        ("PGHOST", u.host),
        ("PGPORT", u.port),
        ("PGUSER", u.username),
        ("PGPASSWORD", u.password),
        ("PGDATABASE", u.database),
    ):
        if value is not None:
            env[key] = str(value)
    return env


def _pg_tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise BackupError(f"{name} is not installed (PATH): install the PostgreSQL client tools")
    return path


def _run_tool(argv: list[str], env: dict[str, str]) -> None:
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        raise BackupError(f"{Path(argv[0]).name} failed: {last}")


def _copy_tree(src: Path, dest: Path, *, objects: bool = False) -> None:
    """Copy a directory, without lock files (and, in `objects/`, without push quarantines)."""

    def ignore(_dir: str, names: list[str]) -> set[str]:
        return {n for n in names if n.endswith(_SKIP_SUFFIXES) or (objects and n.startswith(_QUARANTINES))}

    shutil.copytree(src, dest, ignore=ignore, dirs_exist_ok=True, symlinks=True)


def _sqlite_facts(conn: sqlite3.Connection) -> tuple[str | None, dict[str, int]]:
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    revision = None
    if "alembic_version" in tables:
        row = conn.execute("SELECT version_num FROM alembic_version").fetchone()
        revision = row[0] if row else None
    # The names are this module's constants (COUNTED), never input.
    counts = {t: conn.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0] for t in COUNTED if t in tables}  # noqa: S608
    return revision, counts


# --- backup: database first ----------------------------------------------------------------------


def snapshot_sqlite(settings: Settings, dest: Path) -> tuple[str | None, dict[str, int]]:
    """Copy the live SQLite file with the online backup API (one read transaction: a consistent
    snapshot, safe beside a running server); the revision and counts are read from the copy."""
    source = _sqlite_path(settings)
    target = dest / SQLITE_FILE
    src = sqlite3.connect(source, timeout=30)
    try:
        dst = sqlite3.connect(target)
        try:
            src.backup(dst)
            return _sqlite_facts(dst)
        finally:
            dst.close()
    finally:
        src.close()


def snapshot_postgres(settings: Settings, dest: Path) -> tuple[str | None, dict[str, int]]:
    """`pg_dump --format=custom` of one exported snapshot, the revision and counts read from it."""
    import asyncio

    from sqlalchemy import text
    from sqlalchemy.ext.asyncio import create_async_engine

    url = settings.effective_database_url
    pg_dump = _pg_tool("pg_dump")

    async def go() -> tuple[str | None, dict[str, int]]:
        engine = create_async_engine(url, isolation_level="REPEATABLE READ")
        try:
            async with engine.connect() as conn, conn.begin():
                snapshot = (await conn.execute(text("SELECT pg_export_snapshot()"))).scalar_one()
                rows = await conn.execute(
                    text("SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()")
                )
                tables = {r[0] for r in rows}
                revision = None
                if "alembic_version" in tables:
                    revision = (await conn.execute(text("SELECT version_num FROM alembic_version"))).scalar()
                counts = {}
                for t in COUNTED:
                    if t in tables:
                        counts[t] = (await conn.execute(text(f'SELECT count(*) FROM "{t}"'))).scalar_one()  # noqa: S608
                argv = [pg_dump, "--format=custom", f"--snapshot={snapshot}", f"--file={dest / PG_FILE}"]
                await asyncio.to_thread(_run_tool, argv, _pg_env(url))
                return revision, counts
        finally:
            await engine.dispose()

    return asyncio.run(go())


# --- backup: repositories second -----------------------------------------------------------------


def bare_repositories(root: Path) -> list[Path]:
    """The bare repositories under the store's root (`<owner>/<name>.git`), sorted."""
    if not root.is_dir():
        return []
    return sorted(p for p in root.glob("*/*.git") if (p / "HEAD").is_file() and (p / "objects").is_dir())


def copy_repository(src: Path, dest: Path) -> None:
    """Refs first, then objects (append-only: everything a copied ref names is already there), then
    the rest (config, description, info)."""
    dest.mkdir(parents=True)
    for part in _REF_PARTS:
        path = src / part
        if path.is_dir():
            _copy_tree(path, dest / part)
        elif path.is_file():
            shutil.copy2(path, dest / part)
    _copy_tree(src / "objects", dest / "objects", objects=True)
    for entry in src.iterdir():
        if entry.name in (*_REF_PARTS, "objects") or entry.name.endswith(_SKIP_SUFFIXES):
            continue
        if entry.is_dir():
            _copy_tree(entry, dest / entry.name)
        else:
            shutil.copy2(entry, dest / entry.name)


def copy_repositories(settings: Settings, dest: Path) -> int:
    root = settings.data_dir / "repos"
    repos = bare_repositories(root)
    for repo in repos:
        copy_repository(repo, dest / DATA / "repos" / repo.relative_to(root))
    (dest / DATA / "repos").mkdir(parents=True, exist_ok=True)
    journal = settings.data_dir / "push-journal"
    if journal.is_dir():
        _copy_tree(journal, dest / DATA / "push-journal")
    return len(repos)


def copy_instance_files(settings: Settings, dest: Path) -> list[str]:
    copied = []
    for name in INSTANCE_FILES:
        path = settings.data_dir / name
        if path.is_file():
            shutil.copy2(path, dest / DATA / name)
            copied.append(name)
    return copied


def write_manifest(dest: Path, manifest: dict[str, Any]) -> None:
    (dest / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _fresh_destination(dest: Path) -> Path:
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise BackupError(f"{dest} already exists and is not an empty directory: choose a new DEST")
    partial = dest.with_name(dest.name + ".partial")
    if partial.exists():
        shutil.rmtree(partial)  # what an interrupted backup left
    partial.mkdir(parents=True, mode=0o700)
    (partial / DATA).mkdir(mode=0o700)
    return partial


@click.command("backup", short_help="Back up the instance (database, repositories, key).")
@click.argument("dest", type=click.Path(file_okay=False, path_type=Path))
def backup_command(dest: Path) -> None:
    """Back up the instance into the new directory DEST: the database first (a consistent snapshot,
    safe while the server runs), then the repositories, the push journal and the secret key."""
    from forge.app.commands.context import instance_settings
    from forge.core.version import VERSION

    settings = instance_settings()
    dest = dest.expanduser().absolute()
    partial = _fresh_destination(dest)
    started = datetime.now(UTC)
    kind = "sqlite" if settings.is_sqlite else "postgresql"
    snapshot = snapshot_sqlite if settings.is_sqlite else snapshot_postgres
    revision, counts = snapshot(settings, partial)
    repos = copy_repositories(settings, partial)
    files = copy_instance_files(settings, partial)
    write_manifest(
        partial,
        {
            "format": FORMAT,
            "forgehand_version": VERSION,
            "alembic_revision": revision,
            "created_at": started.isoformat(),
            "database": kind,
            "counts": {**counts, "bare_repositories": repos},
            "instance_files": files,
        },
    )
    if dest.exists():
        dest.rmdir()  # empty (checked above)
    partial.rename(dest)
    click.echo(f"backed up {kind} database (revision {revision}) and {repos} repositories to {dest}")
    if "secret_key" not in files:
        click.echo(
            "note: the secret key is not a file of the data directory (FORGEHAND_SECRET_KEY): keep it "
            "with this backup, model keys and repository secrets cannot be read without it",
            err=True,
        )


# --- restore -------------------------------------------------------------------------------------


def read_manifest(src: Path) -> dict[str, Any]:
    try:
        manifest: dict[str, Any] = json.loads((src / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise BackupError(f"{src} is not a forgehand backup (no readable {MANIFEST})") from None
    if manifest.get("format") != FORMAT:
        raise BackupError(f"{src}: backup format {manifest.get('format')!r} is not supported (expected {FORMAT})")
    return manifest


def check_empty_data_dir(data_dir: Path) -> None:
    if data_dir.exists() and (not data_dir.is_dir() or any(data_dir.iterdir())):
        raise BackupError(
            f"refusing to restore into {data_dir}: it is not empty (restore needs a fresh data directory)"
        )


def check_sqlite_target(settings: Settings, force: bool) -> Path:
    target = _sqlite_path(settings)
    if target.exists() and target.stat().st_size > 0 and not force:
        raise BackupError(f"refusing to restore over the database file {target}: it exists (--force replaces it)")
    return target


def _postgres_tables(url: str) -> int:
    import asyncio

    from sqlalchemy import text
    from sqlalchemy.ext.asyncio import create_async_engine

    async def go() -> int:
        engine = create_async_engine(url)
        try:
            async with engine.connect() as conn:
                query = "SELECT count(*) FROM information_schema.tables WHERE table_schema = current_schema()"
                return int((await conn.execute(text(query))).scalar_one())
        finally:
            await engine.dispose()

    try:
        return asyncio.run(go())
    except OSError as exc:
        raise BackupError(f"cannot connect to the database of FORGEHAND_DATABASE_URL: {exc.strerror or exc}") from None


def check_postgres_target(settings: Settings, force: bool) -> None:
    from sqlalchemy.engine import make_url

    tables = _postgres_tables(settings.effective_database_url)
    if tables and not force:
        name = make_url(settings.effective_database_url).database
        raise BackupError(
            f"refusing to restore into database {name!r}: it already has {tables} tables "
            "(restore into an empty database, or pass --force to replace what the backup holds)"
        )


def restore_files(src: Path, data_dir: Path) -> None:
    data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    _copy_tree(src / DATA, data_dir)
    (data_dir / "repos").mkdir(exist_ok=True, mode=0o700)


def restore_sqlite(src: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    for stale in (target.with_name(target.name + "-wal"), target.with_name(target.name + "-shm")):
        stale.unlink(missing_ok=True)
    partial = target.with_name(target.name + ".restoring")
    shutil.copyfile(src / SQLITE_FILE, partial)
    partial.replace(target)


def restore_postgres(src: Path, settings: Settings, force: bool) -> None:
    argv = [_pg_tool("pg_restore"), "--no-owner", "--no-privileges", "--exit-on-error", "--single-transaction"]
    if force:
        argv += ["--clean", "--if-exists"]
    env = _pg_env(settings.effective_database_url)
    _run_tool([*argv, f"--dbname={env.get('PGDATABASE', '')}", str(src / PG_FILE)], env)


def revision_note(settings: Settings) -> str:
    import asyncio

    from alembic.script import ScriptDirectory

    from forge.db.engine import Database
    from forge.db.migrate import alembic_config, current_revision, head_revision

    async def go() -> str | None:
        db = Database(settings.effective_database_url)
        try:
            return await current_revision(db.engine)
        finally:
            await db.dispose()

    current, head = asyncio.run(go()), head_revision()
    if current == head:
        return f"the database is at this forgehand's revision ({head})"
    try:
        known = current is not None and ScriptDirectory.from_config(alembic_config("sqlite://")).get_revision(current)
    except Exception:  # an unknown revision: alembic raises its own errors
        known = False
    if not known:
        return (
            f"the database is at revision {current}, which this forgehand does not know: "
            "install the forgehand version that made the backup"
        )
    return f"the database is at revision {current}, not {head}: run `forgehand db upgrade`"


@click.command("restore", short_help="Restore a backup into a fresh data directory.")
@click.argument("src", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option(
    "--data-dir",
    "target_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="The new, empty data directory (default: forgehand's --data-dir / FORGEHAND_DATA_DIR).",
)
@click.option("--force", is_flag=True, help="Replace an existing database (never a non-empty data directory).")
def restore_command(src: Path, target_dir: Path | None, force: bool) -> None:
    """Restore the backup SRC into a fresh data directory and a fresh database (SQLite: the file;
    PostgreSQL: the database of FORGEHAND_DATABASE_URL, which must have no tables)."""
    import msgspec

    from forge.core.settings import absolute_data_dir, load_settings

    root_dir = click.get_current_context().find_root().params.get("data_dir")
    overrides = {"data_dir": d} if (d := target_dir or root_dir) is not None else {}
    settings = load_settings(None, **overrides)
    data_dir = absolute_data_dir(settings.data_dir)
    settings = msgspec.structs.replace(settings, data_dir=data_dir)
    manifest = read_manifest(src)
    check_empty_data_dir(data_dir)
    kind = "sqlite" if settings.is_sqlite else "postgresql"
    if manifest.get("database") != kind:
        raise BackupError(
            f"the backup holds a {manifest.get('database')} database but this instance is configured "
            f"for {kind} (FORGEHAND_DATABASE_URL)"
        )
    target = check_sqlite_target(settings, force) if settings.is_sqlite else None
    if not settings.is_sqlite:
        check_postgres_target(settings, force)
    restore_files(src, data_dir)
    if target is not None:
        restore_sqlite(src, target)
    else:
        restore_postgres(src, settings, force)
    click.echo(f"restored {src} into {data_dir} ({kind} database)")
    click.echo(revision_note(settings))
