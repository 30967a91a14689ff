"""The `forgehand` command. Errors are one clear line on stderr and exit status 2.

Importing this module is cheap: `forgehand --help` and every command's help load click and this
file only. Whatever a command needs (the database, the app, Docker, the webhooks consumer) is
imported inside the command, and the `sandbox` and `hooks` groups are loaded when invoked."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from forge.accounts import accounts, tokens
    from forge.core.settings import Settings
    from forge.db import audit
    from forge.db.audit import Actor
    from forge.db.engine import Database

T = TypeVar("T")

# Groups that live in other packages: (module, attribute, one-line help shown by `forgehand --help`
# without importing them).
LAZY_GROUPS = {
    "hooks": ("webhooks.cli", "hooks_group", "Webhook tools: the reference consumer."),
    "sandbox": ("sandbox.cli", "sandbox_group", "Build, list and reap sandbox images and containers."),
}


def _expected_errors() -> tuple[type[BaseException], ...]:
    from forge.core.errors import ForgeError
    from forge.core.settings import SettingsError
    from forge.git.errors import RepoError

    return (ForgeError, SettingsError, RepoError)


class ForgehandGroup(click.Group):
    """Turns expected failures into one line and exit status 2 (never a traceback); loads the
    groups of LAZY_GROUPS only when one of them is invoked."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *LAZY_GROUPS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in LAZY_GROUPS and cmd_name not in self.commands:
            module, attribute, _ = LAZY_GROUPS[cmd_name]
            command = getattr(importlib.import_module(module), attribute)
            assert isinstance(command, click.Command)
            self.add_command(command, cmd_name)
        return super().get_command(ctx, cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        limit = formatter.width - 6 - max(len(name) for name in self.list_commands(ctx))
        rows = []
        for name in self.list_commands(ctx):
            command = self.commands.get(name)
            if command is not None and not command.hidden:
                rows.append((name, command.get_short_help_str(limit)))
            elif command is None:
                rows.append((name, LAZY_GROUPS[name][2]))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise  # click's own (usage errors, --help): it prints them
        except OSError as exc:
            click.echo(f"forgehand: error: {exc.strerror or exc}", err=True)
            sys.exit(2)
        except Exception as exc:
            if not isinstance(exc, _expected_errors()):
                raise
            click.echo(f"forgehand: error: {exc}", err=True)
            sys.exit(2)


def _cli_actor() -> Actor:
    from forge.db.audit import Actor

    return Actor.system("cli")


async def _require_migrated(db: Database) -> None:
    """Commands other than `serve` (which migrates on start) and `db upgrade` need the schema."""
    from forge.db.migrate import current_revision, head_revision

    current, head = await current_revision(db.engine), head_revision()
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


def _settings(**overrides: Any) -> Settings:
    """Settings for the commands that start or create an instance (`serve`, `worker`, `db upgrade`):
    the data directory is created when missing."""
    from forge.core.settings import prepare_data_dir

    return prepare_data_dir(_load(**overrides))


def _instance_settings() -> Settings:
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


def _run_db(settings: Settings, fn: Callable[[Database], Awaitable[T]]) -> T:
    import asyncio

    from forge.db.engine import Database

    async def go() -> T:
        db = Database(settings.effective_database_url)
        try:
            await _require_migrated(db)
            return await fn(db)
        finally:
            await db.dispose()

    return asyncio.run(go())


@click.group(cls=ForgehandGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="The instance's data directory (FORGEHAND_DATA_DIR, default ./var of the current directory).",
)
def main(data_dir: Path | None) -> None:
    """forgehand: a self-hosted git forge whose collaborators hand work to AI coding agents."""


@main.command()
@click.option("--host", default=None, help="Address to listen on (FORGEHAND_HOST, default 127.0.0.1).")
@click.option("--port", type=int, default=None, help="Port (FORGEHAND_PORT, default 8000).")
def serve(host: str | None, port: int | None) -> None:
    """Migrate the database, create the first admin if needed, and serve."""
    import uvicorn

    from forge.accounts import bootstrap
    from forge.app.factory import create_app
    from forge.app.heap import freeze_startup_heap
    from forge.db.migrate import upgrade
    from forge.http.api.reference import warm_up

    settings = _settings(host=host, port=port)
    upgrade(settings.effective_database_url)
    password = _run_db(settings, lambda db: bootstrap.ensure_admin(db, settings))
    if password:
        click.echo("")
        click.echo("  First start: an instance admin was created.")
        click.echo(f"  login:    {bootstrap.ADMIN_LOGIN}")
        click.echo(f"  password: {password}")
        click.echo(f"  (also in {settings.data_dir / bootstrap.PASSWORD_FILE}, mode 0600, until you change it)")
        click.echo("  Sign in and choose your own password: the first page asks for it.")
        click.echo("")
    if settings.seed_demo and password:
        demo_name = _run_db(settings, lambda db: _seed_demo(db, settings))
        if demo_name:
            click.echo(f"  Demo repository: {settings.effective_base_url}/{demo_name}  (bot: demo-agent, write access)")
    click.echo(f"forgehand {settings.effective_base_url}  (data: {settings.data_dir})")
    app = create_app(settings)
    warm_up(app)  # the API reference's document, built in the background from the start
    freeze_startup_heap()
    uvicorn.run(app, host=settings.host, port=settings.port, log_level="warning", proxy_headers=False)


async def _seed_demo(db: Database, settings: Settings) -> str | None:
    from forge.accounts import bootstrap
    from forge.app import demo
    from forge.db.events import EventBus
    from forge.git import RepoStore

    store = RepoStore(settings.data_dir / "repos")
    try:
        # Seeding happens before the app (and its webhook subscribers) exist: nothing to notify yet.
        return await demo.seed(db, store, EventBus(), bootstrap.ADMIN_LOGIN)
    finally:
        await store.close()


@main.group()
def db() -> None:
    """Database maintenance."""


@db.command("upgrade")
def db_upgrade() -> None:
    """Apply all migrations."""
    from forge.db.migrate import upgrade

    settings = _settings()
    upgrade(settings.effective_database_url)
    click.echo("database is up to date")


def _prompt_twice(prompt: str) -> str:
    import getpass

    password = getpass.getpass(prompt)
    if getpass.getpass("again: ") != password:
        raise click.UsageError("the passwords differ")
    return password


@main.group()
def users() -> None:
    """Manage people's accounts."""


@users.command("create")
@click.argument("login")
@click.option("--admin", is_flag=True, help="Make an instance admin.")
@click.option("--password", default=None, help="Password (prompted when interactive; generated otherwise).")
def users_create(login: str, admin: bool, password: str | None) -> None:
    """Create a person's account."""
    from forge.accounts import accounts

    settings = _instance_settings()  # before any prompt: a wrong data directory is said first
    generated = False
    if password is None:
        if sys.stdin.isatty():
            password = _prompt_twice(f"password for {login}: ")
        else:
            from forge.core.security import generate_password

            password, generated = generate_password(), True
    pw = password

    async def go(db: Database) -> None:
        async with db.session(write=True) as session:
            await accounts.create_user(session, _cli_actor(), login, pw, is_admin=admin, must_change_password=generated)

    _run_db(settings, go)
    click.echo(f"created user {login}" + (" (admin)" if admin else ""))
    if generated:
        click.echo(f"password: {password}  (generated: {login} must change it at the first sign-in)")


@users.command("list")
def users_list() -> None:
    """List accounts (people and bots): a header line, then one tab-separated line per account."""
    from forge.accounts import accounts

    settings = _instance_settings()

    async def go(db: Database) -> list[accounts.AccountRead]:
        async with db.session() as session:
            return [await accounts.to_read(session, a) for a in await accounts.list_accounts(session)]

    listed = _run_db(settings, go)
    click.echo("login\ttype\tflags\towner")
    for a in listed:
        flags = ",".join(f for f, on in (("admin", a.is_admin), ("disabled", a.disabled)) if on)
        click.echo(f"{a.login}\t{a.type}\t{flags or '-'}\t{a.owner or '-'}")


@users.command("disable")
@click.argument("login")
def users_disable(login: str) -> None:
    """Disable an account (its sessions end, its tokens stop working)."""
    from forge.accounts import accounts, websessions

    settings = _instance_settings()

    async def go(db: Database) -> None:
        async with db.session(write=True) as session:
            account = await accounts.set_disabled(session, _cli_actor(), login, True)
            await websessions.destroy_all_for(session, account.id)

    _run_db(settings, go)
    click.echo(f"disabled {login}")


@users.command("set-password")
@click.argument("login")
def users_set_password(login: str) -> None:
    """Set a person's password, read from a prompt (twice) or, when stdin is not a terminal, its
    first line; never from the command line. Their browser sessions end; tokens keep working."""
    from forge.accounts import accounts

    settings = _instance_settings()
    if sys.stdin.isatty():
        password = _prompt_twice(f"new password for {login}: ")
    else:
        password = sys.stdin.readline().rstrip("\r\n")

    async def go(db: Database) -> int:
        async with db.session(write=True) as session:
            return await accounts.set_password(session, _cli_actor(), login, password)

    ended = _run_db(settings, go)
    click.echo(f"password of {login} set ({ended} session(s) signed out)")


@main.group()
def bots() -> None:
    """Manage bot accounts (they act only through tokens)."""


@bots.command("create")
@click.argument("login")
@click.option("--owner", default=None, help="Login of the person responsible for the bot.")
def bots_create(login: str, owner: str | None) -> None:
    """Create a bot account."""
    from forge.accounts import accounts

    settings = _instance_settings()

    async def go(db: Database) -> None:
        async with db.session(write=True) as session:
            owner_row = await accounts.require_by_login(session, owner) if owner else None
            await accounts.create_bot(session, _cli_actor(), login, owner=owner_row)

    _run_db(settings, go)
    click.echo(f"created bot {login}")


@main.group("tokens")
def tokens_group() -> None:
    """Manage personal access tokens."""


@tokens_group.command("create")
@click.option("--user", "login", required=True, help="Account that owns the token.")
@click.option("--name", required=True, help="A name to recognise the token by.")
@click.option("--scope", "scopes", multiple=True, required=True, help="A scope; repeat for several.")
@click.option("--expires-days", type=int, default=None, help="Expire after N days (default: never).")
def tokens_create(login: str, name: str, scopes: tuple[str, ...], expires_days: int | None) -> None:
    """Create a token; the token alone is printed on the last line."""
    from forge.accounts import accounts, tokens

    settings = _instance_settings()

    async def go(db: Database) -> tokens.TokenCreated:
        async with db.session(write=True) as session:
            owner = await accounts.require_by_login(session, login)
            return await tokens.create(session, _cli_actor(), owner, name, list(scopes), expires_days)

    created = _run_db(settings, go)
    click.echo(f"token {created.info.id} for {login} ({' '.join(created.info.scopes)}); shown once:")
    click.echo(created.token)


@tokens_group.command("list")
@click.option("--user", "login", required=True, help="Account whose tokens to list.")
@click.option("--all", "include_revoked", is_flag=True, help="Include revoked tokens.")
def tokens_list(login: str, include_revoked: bool) -> None:
    """List an account's tokens."""
    from forge.accounts import accounts, tokens

    settings = _instance_settings()

    async def go(db: Database) -> list[tokens.TokenRead]:
        async with db.session() as session:
            owner = await accounts.require_by_login(session, login)
            return await tokens.list_for(session, owner, include_revoked=include_revoked)

    for t in _run_db(settings, go):
        state = "revoked" if t.revoked else (f"expires {t.expires_at:%Y-%m-%d}" if t.expires_at else "no expiry")
        click.echo(f"{t.id}\t{t.name}\t...{t.last_eight}\t{','.join(t.scopes)}\t{state}")


@tokens_group.command("revoke")
@click.argument("token_id", type=int)
def tokens_revoke(token_id: int) -> None:
    """Revoke a token by id."""
    from forge.accounts import tokens

    settings = _instance_settings()

    async def go(db: Database) -> None:
        async with db.session(write=True) as session:
            await tokens.revoke(session, _cli_actor(), token_id)

    _run_db(settings, go)
    click.echo(f"revoked token {token_id}")


@main.group("repos")
def repos_group() -> None:
    """Manage repositories."""


@repos_group.command("import")
@click.argument("source")
@click.option("--owner", required=True, help="Login of the owning account.")
@click.option("--name", default=None, help="Repository name (default: from SOURCE).")
@click.option("--visibility", type=click.Choice(["private", "internal", "public"]), default="private")
def repos_import(source: str, owner: str, name: str | None, visibility: str) -> None:
    """Import a repository on this machine (a path or a file:// URL): all branches and tags."""
    from forge.accounts import accounts
    from forge.git import RepoStore
    from forge.repos import lifecycle

    settings = _instance_settings()
    repo_name = name or source.rstrip("/").rsplit("/", 1)[-1].removesuffix(".git")

    async def go(db: Database) -> str:
        store = RepoStore(settings.data_dir / "repos")
        try:
            async with db.session(write=True) as session:
                owner_row = await accounts.require_by_login(session, owner)
                repo = await lifecycle.import_existing(
                    session, store, _cli_actor(), owner_row, repo_name, source, visibility=visibility
                )
                return f"{owner_row.login}/{repo.name} (default branch {repo.default_branch})"
        finally:
            await store.close()

    click.echo(f"imported {_run_db(settings, go)}")


@main.group("audit")
def audit_group() -> None:
    """Read the audit log."""


@audit_group.command("tail")
@click.option("-n", "--lines", default=20, show_default=True, help="How many rows, newest last.")
def audit_tail(lines: int) -> None:
    """Show the newest audit rows."""
    from forge.db import audit

    settings = _instance_settings()

    async def go(db: Database) -> list[audit.AuditRead]:
        async with db.session() as session:
            return list(await audit.tail(session, limit=lines))

    for r in reversed(_run_db(settings, go)):
        click.echo(
            f"{r.at:%Y-%m-%dT%H:%M:%SZ}\t{r.actor}\t{r.client_addr or '-'}\t{r.action}\t{r.target}\t{r.result}"
            f"\t{r.detail if r.detail else ''}"
        )


@main.command()
def worker() -> None:
    """Run the task worker in its own process (claims queued runs; start several on Docker hosts)."""
    import asyncio

    from forge.app.heap import freeze_startup_heap
    from forge.db.migrate import upgrade
    from tasks.system import run_worker_process

    settings = _settings()
    upgrade(settings.effective_database_url)
    click.echo(f"forgehand worker: claiming runs from {settings.effective_database_url.split('://')[0]} database")
    freeze_startup_heap()
    asyncio.run(run_worker_process(settings))
