"""The checks of `forgehand doctor` (forge.app.commands.doctor prints them): what an instance
needs, checked and explained for its operator.

Each check is a small function returning a `Check`: OK, WARN or FAIL, what was found, and for
anything not OK the fix in words (a command to run, a variable to set). Nothing is created: not the
data directory, not the SQLite file, no image. They live in the composition root (forge.app), the
one place of forge that may ask the sandbox (Docker) and egress (its allow-list parser).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import msgspec

if TYPE_CHECKING:
    from forge.core.settings import Settings
    from forge.db.engine import Database

Status = Literal["OK", "WARN", "FAIL"]

MIN_FREE_BYTES = 1024**3
DATABASE_TIMEOUT = 10.0
DOCKER_TIMEOUT = 5.0
# Replicas (`serve` and `worker` processes on several hosts) share leases and deadlines through the
# database: their clocks must agree with it.
CLOCK_WARN_SECONDS = 2.0
CLOCK_FAIL_SECONDS = 30.0
# Allow-lists that load_settings itself validates (the first bad entry stops it).
_VALIDATED_ALLOW_LISTS = ("model_allowed_hosts", "webhooks_allowed_hosts")


class Check(msgspec.Struct, frozen=True):
    check: str
    status: Status
    detail: str
    fix: str = ""


def _env(name: str) -> str:
    return "FORGEHAND_" + name.upper()


# -- settings ----------------------------------------------------------------------------------


def load(data_dir: Path | None) -> tuple[Settings | None, list[Check]]:
    """The settings as every command loads them (nothing created), and their checks. A bad entry in
    an allow-list load_settings validates is reported on the allow-list line, not as bad settings."""
    from forge.core.settings import SettingsError, load_settings

    given: dict[str, Any] = {} if data_dir is None else {"data_dir": data_dir}
    try:
        settings = load_settings(None, **given)
    except SettingsError as exc:
        try:
            settings = load_settings(None, **given, **dict.fromkeys(_VALIDATED_ALLOW_LISTS, ""))
        except SettingsError:
            fix = "correct the variable (or FORGEHAND_CONFIG file key) the message names"
            return None, [Check("settings", "FAIL", str(exc), fix)]
        rest = check_allow_lists(settings)  # the others (those two blanked)
        detail = str(exc) + (f"; {rest.detail}" if rest.status == "FAIL" else "")
        return settings, [_settings_ok(settings), _allow_list_fix(Check("allow-lists", "FAIL", detail))]
    return settings, [_settings_ok(settings), check_allow_lists(settings)]


def _settings_ok(settings: Settings) -> Check:
    source = os.environ.get("FORGEHAND_CONFIG")
    origin = f"environment and {source}" if source else "environment"
    kind = "SQLite" if settings.is_sqlite else "PostgreSQL"
    return Check("settings", "OK", f"loaded from the {origin}; {kind} database, run_worker={settings.run_worker}")


def _allow_list_fix(check: Check) -> Check:
    fix = "correct or remove the entry named (host names, addresses or CIDRs, comma-separated)"
    return msgspec.structs.replace(check, fix=fix)


def check_allow_lists(settings: Settings) -> Check:
    """Every entry of every `*_allowed_hosts` setting parses, with the parser that will read it."""
    from egress import AllowedHosts, RuleError
    from forge.core.addresses import AllowList

    bad: list[str] = []
    counts: list[str] = []
    for name in (f.name for f in msgspec.structs.fields(settings) if "allowed_hosts" in f.name):
        entries = [e.strip() for e in getattr(settings, name).split(",") if e.strip()]
        counts.append(f"{name} {len(entries)}")
        for entry in entries:
            try:
                if name.startswith("egress"):
                    AllowedHosts.parse(entry)
                else:
                    AllowList.parse(entry, setting=_env(name))
            except (ValueError, RuleError):
                bad.append(f"{_env(name)}: {entry!r}")
    if bad:
        return _allow_list_fix(Check("allow-lists", "FAIL", "not a host, address or CIDR: " + ", ".join(bad)))
    return Check("allow-lists", "OK", "entries: " + ", ".join(counts))


# -- the data directory and the repositories ---------------------------------------------------


def check_data_dir(settings: Settings) -> Check:
    path = settings.data_dir
    where = "set FORGEHAND_DATA_DIR (or --data-dir) to the instance's data directory"
    if not path.is_absolute():
        return Check("data-dir", "FAIL", f"{path} is not absolute", where)
    if not path.is_dir():
        what = "is not a directory" if path.exists() else "does not exist"
        return Check("data-dir", "FAIL", f"{path} {what}", f"{where}, or run `forgehand db upgrade` to create one")
    if not os.access(path, os.W_OK | os.X_OK):
        return Check("data-dir", "FAIL", f"{path} is not writable by this user", f"run forgehand as {path}'s owner")
    free = shutil.disk_usage(path).free
    detail = f"{path}, {free / 1024**3:.1f} GiB free"
    if free < MIN_FREE_BYTES:
        return Check("data-dir", "WARN", detail + " (under 1 GiB)", "free disk space or move the data directory")
    return Check("data-dir", "OK", detail)


def check_repos(settings: Settings) -> Check:
    root = settings.data_dir / "repos"
    if not root.is_dir():
        return Check("repos", "FAIL", f"{root} does not exist", "run `forgehand db upgrade` (creates it) or restore it")
    if not os.access(root, os.W_OK | os.X_OK):
        return Check("repos", "FAIL", f"{root} is not writable by this user", f"run forgehand as {root}'s owner")
    repos = [p for p in root.glob("*/*.git") if p.is_dir()]
    unreadable = [p for p in repos if not (os.access(p, os.R_OK | os.X_OK) and os.access(p / "HEAD", os.R_OK))]
    if unreadable:
        names = ", ".join(str(p.relative_to(root)) for p in unreadable[:5])
        more = f" and {len(unreadable) - 5} more" if len(unreadable) > 5 else ""
        detail = f"{len(unreadable)} of {len(repos)} repositories unreadable: {names}{more}"
        return Check("repos", "FAIL", detail, f"give this user read access (chown -R) under {root}")
    return Check("repos", "OK", f"{root}, {len(repos)} repositories readable")


# -- the database ------------------------------------------------------------------------------


def _shown_url(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def sqlite_file_missing(settings: Settings) -> Check | None:
    """Connecting would create an empty SQLite file: look first."""
    if not settings.is_sqlite:
        return None
    path = settings.effective_database_url.split(":///", 1)[-1].split("?", 1)[0]
    if not path or path == ":memory:" or Path(path).is_file():
        return None
    fix = "run `forgehand db upgrade`" + (", or correct FORGEHAND_DATABASE_URL" if settings.database_url else "")
    return Check("database", "FAIL", f"no database file at {path}", fix)


async def check_database(settings: Settings, db: Database) -> tuple[Check, bool]:
    """The database's line, and whether it answered."""
    from forge.db.migrate import current_revision

    url = _shown_url(settings.effective_database_url)
    try:
        async with asyncio.timeout(DATABASE_TIMEOUT):
            current = await current_revision(db.engine)
    except Exception as exc:  # any driver's failure to connect: the line says which
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        fix = "check FORGEHAND_DATABASE_URL and that the database server is running and reachable"
        return Check("database", "FAIL", f"cannot reach {url}: {reason}", fix), False
    return _compare_revisions(url, current), True


def _compare_revisions(url: str, current: str | None) -> Check:
    from alembic.script import ScriptDirectory

    from forge.db.migrate import alembic_config, head_revision

    head = head_revision()
    if current == head:
        return Check("database", "OK", f"{url} at revision {current} (the code's head)")
    if current is None:
        return Check("database", "FAIL", f"{url} has no forgehand tables", "run `forgehand db upgrade`")
    scripts = ScriptDirectory.from_config(alembic_config("sqlite://"))
    try:
        known = scripts.get_revision(current) is not None
    except Exception:  # alembic's errors for a revision it has never heard of
        known = False
    if known:
        return Check("database", "FAIL", f"{url} at revision {current}, behind {head}", "run `forgehand db upgrade`")
    detail = f"{url} at revision {current}, which this code (head {head}) does not know"
    return Check("database", "FAIL", detail, "this code is older than the database: run the newer forgehand release")


async def check_clock(settings: Settings, db: Database) -> Check:
    from sqlalchemy import text

    if settings.is_sqlite:
        return Check("clock", "OK", "SQLite: one machine, one clock")
    try:
        async with asyncio.timeout(DATABASE_TIMEOUT), db.engine.connect() as conn:
            before = time.time()
            db_now = float((await conn.execute(text("SELECT extract(epoch FROM now())"))).scalar_one())
            after = time.time()
    except Exception as exc:
        return Check("clock", "WARN", f"not compared: {str(exc).splitlines()[0] if str(exc) else exc!r}", "")
    # The database's now() lies between before and after: only what exceeds half the round trip counts.
    skew = max(0.0, abs(db_now - (before + after) / 2) - (after - before) / 2)
    detail = f"this host and the database differ by {skew:.2f} s"
    fix = "synchronise the clocks (NTP: chrony or systemd-timesyncd) of this host and the database server"
    if skew > CLOCK_FAIL_SECONDS:
        return Check("clock", "FAIL", detail + " (replicas must agree)", fix)
    if skew > CLOCK_WARN_SECONDS:
        return Check("clock", "WARN", detail, fix)
    return Check("clock", "OK", detail)


async def check_shared_storage(settings: Settings, db: Database) -> Check:
    """Every repository the database knows is in this host's repositories' directory: on a second
    host (a replica, a worker) the shared storage is mounted where the settings say."""
    from sqlalchemy import select

    from forge.db.models import Account, Repository
    from forge.git.names import repo_path

    root = settings.data_dir / "repos"
    try:
        async with asyncio.timeout(DATABASE_TIMEOUT), db.session() as s:
            query = select(Account.login, Repository.name).join(Account, Repository.owner_id == Account.id)
            names = [(owner, name) for owner, name in (await s.execute(query)).tuples().all()]
    except Exception as exc:
        return Check("storage", "WARN", f"not compared: {str(exc).splitlines()[0] if str(exc) else exc!r}", "")
    missing = [f"{o}/{n}" for o, n in names if not repo_path(root, o.lower(), n.lower()).is_dir()]
    if not missing:
        return Check("storage", "OK", f"the {len(names)} repositories the database knows are in {root}")
    shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
    detail = f"{len(missing)} of the {len(names)} repositories the database knows are not in {root}: {shown}"
    fix = "mount the shared data directory on this host at the same path (docs/operator.md, 'Past one machine')"
    return Check("storage", "FAIL", detail, fix)


async def database_checks(settings: Settings) -> list[Check]:
    from forge.db.engine import Database

    missing = sqlite_file_missing(settings)
    if missing is not None:
        return [missing, Check("clock", "OK", "SQLite: one machine, one clock"), _not_compared("storage")]
    db = Database(settings.effective_database_url)
    try:
        database, reachable = await check_database(settings, db)
        if not reachable:
            return [database, _not_compared("clock"), _not_compared("storage")]
        if database.status == "FAIL":  # not migrated: no repositories table to read yet
            return [database, await check_clock(settings, db), _not_compared("storage")]
        return [database, await check_clock(settings, db), await check_shared_storage(settings, db)]
    finally:
        await db.dispose()


def _not_compared(name: str) -> Check:
    return Check(name, "WARN", "not compared: the database is not reachable or not migrated")


# -- Docker --------------------------------------------------------------------------------------


async def docker_checks(settings: Settings) -> list[Check]:
    """The engine (needed where a worker runs) and the images tasks start from."""
    from sandbox import DEFAULT_AGENTS_IMAGE, DEFAULT_IMAGE, SandboxEngine

    engine = SandboxEngine(api_timeout=DOCKER_TIMEOUT, max_workers=2)
    try:
        try:
            version = await engine.call(lambda c: c.version(), timeout=DOCKER_TIMEOUT)
        except Exception as exc:  # EngineUnavailable, or any docker SDK error
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            if settings.run_worker:
                fix = "start the Docker engine (or point DOCKER_HOST at it): this instance runs tasks"
                return [Check("docker", "FAIL", reason, fix)]
            fix = "needed only where tasks run (a `forgehand worker`, or FORGEHAND_RUN_WORKER=true)"
            return [Check("docker", "WARN", reason, fix)]
        checks = [Check("docker", "OK", f"engine {version.get('Version', '?')} (API {version.get('ApiVersion', '?')})")]
        sandbox_image = settings.sandbox_image or DEFAULT_IMAGE
        if await engine.image_ready(sandbox_image):
            checks.append(Check("sandbox-image", "OK", f"{sandbox_image} present"))
        elif settings.sandbox_image and sandbox_image != DEFAULT_IMAGE:
            fix = f"build or load {sandbox_image} on this engine, or unset FORGEHAND_SANDBOX_IMAGE"
            checks.append(Check("sandbox-image", "FAIL", f"{sandbox_image} not present", fix))
        else:
            detail = f"{sandbox_image} not present (or built from an older recipe)"
            checks.append(Check("sandbox-image", "FAIL", detail, "run `forgehand sandbox build`"))
        if await engine.image_ready(DEFAULT_AGENTS_IMAGE):
            checks.append(Check("agents-image", "OK", f"{DEFAULT_AGENTS_IMAGE} present"))
        else:
            fix = "run `forgehand sandbox build --agents`"
            checks.append(Check("agents-image", "FAIL", f"{DEFAULT_AGENTS_IMAGE} not present", fix))
        return checks
    finally:
        await engine.close(grace=1.0)


# -- the command -------------------------------------------------------------------------------


def run_checks(data_dir: Path | None) -> list[Check]:
    settings, checks = load(data_dir)
    if settings is None:
        return checks

    async def both() -> tuple[list[Check], list[Check]]:
        return await asyncio.gather(database_checks(settings), docker_checks(settings))

    settings_line, allow_lists = checks
    (database, clock, storage), docker = asyncio.run(both())
    return [
        settings_line, check_data_dir(settings), database, check_repos(settings), storage, *docker, allow_lists, clock
    ]  # fmt: skip
