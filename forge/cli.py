"""The `forgehand` command. Errors are one clear line on stderr and exit status 2."""

import asyncio
import getpass
import sys
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import click

from forge import accounts, audit, tokens
from forge.audit import Actor
from forge.db import Database
from forge.errors import ForgeError
from forge.git.errors import RepoError
from forge.heap import freeze_startup_heap
from forge.settings import Settings, SettingsError, load_settings, prepare_data_dir

T = TypeVar("T")
CLI_ACTOR = Actor.system("cli")


class ForgehandGroup(click.Group):
    """Turns expected failures into one line and exit status 2 (never a traceback)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (ForgeError, SettingsError, RepoError) as exc:
            click.echo(f"forgehand: error: {exc}", err=True)
            sys.exit(2)
        except OSError as exc:
            click.echo(f"forgehand: error: {exc.strerror or exc}", err=True)
            sys.exit(2)


async def _require_migrated(db: Database) -> None:
    """Commands other than `serve` (which migrates on start) and `db upgrade` need the schema."""
    from forge.migrate import current_revision, head_revision

    current, head = await current_revision(db.engine), head_revision()
    if current != head:
        state = "has no forgehand tables yet" if current is None else f"is at revision {current}, not {head}"
        raise click.ClickException(f"the database {state}: run `forgehand db upgrade` first")


def _settings(**overrides: Any) -> Settings:
    return prepare_data_dir(load_settings(**{k: v for k, v in overrides.items() if v is not None}))


def _run_db(settings: Settings, fn: Callable[[Database], Awaitable[T]]) -> T:
    async def go() -> T:
        db = Database(settings.effective_database_url)
        try:
            await _require_migrated(db)
            return await fn(db)
        finally:
            await db.dispose()

    return asyncio.run(go())


@click.group(cls=ForgehandGroup, context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """forgehand: a self-hosted git forge whose collaborators hand work to AI coding agents."""


@main.command()
@click.option("--host", default=None, help="Address to listen on (FORGEHAND_HOST, default 127.0.0.1).")
@click.option("--port", type=int, default=None, help="Port (FORGEHAND_PORT, default 8000).")
def serve(host: str | None, port: int | None) -> None:
    """Migrate the database, create the first admin if needed, and serve."""
    import uvicorn

    from forge import bootstrap
    from forge.api_reference import warm_up
    from forge.app import create_app
    from forge.migrate import upgrade

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
    click.echo(f"forgehand {settings.effective_base_url}  (data: {settings.data_dir.resolve()})")
    app = create_app(settings)
    warm_up(app)  # the API reference's document, built in the background from the start
    freeze_startup_heap()
    uvicorn.run(app, host=settings.host, port=settings.port, log_level="warning", proxy_headers=False)


async def _seed_demo(db: Database, settings: Settings) -> str | None:
    from forge import bootstrap, demo
    from forge.events import EventBus
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
    from forge.migrate import upgrade

    settings = _settings()
    upgrade(settings.effective_database_url)
    click.echo("database is up to date")


@main.group()
def users() -> None:
    """Manage people's accounts."""


@users.command("create")
@click.argument("login")
@click.option("--admin", is_flag=True, help="Make an instance admin.")
@click.option("--password", default=None, help="Password (prompted when interactive; generated otherwise).")
def users_create(login: str, admin: bool, password: str | None) -> None:
    """Create a person's account."""
    generated = False
    if password is None:
        if sys.stdin.isatty():
            password = getpass.getpass(f"password for {login}: ")
            if getpass.getpass("again: ") != password:
                raise click.UsageError("the passwords differ")
        else:
            from forge.security import generate_password

            password, generated = generate_password(), True
    settings = _settings()
    pw = password

    async def go(db: Database) -> None:
        async with db.session(write=True) as session:
            await accounts.create_user(session, CLI_ACTOR, login, pw, is_admin=admin, must_change_password=generated)

    _run_db(settings, go)
    click.echo(f"created user {login}" + (" (admin)" if admin else ""))
    if generated:
        click.echo(f"password: {password}  (generated: {login} must change it at the first sign-in)")


@users.command("list")
def users_list() -> None:
    """List accounts (people and bots)."""
    settings = _settings()

    async def go(db: Database) -> list[accounts.AccountRead]:
        async with db.session() as session:
            return [await accounts.to_read(session, a) for a in await accounts.list_accounts(session)]

    for a in _run_db(settings, go):
        flags = ",".join(f for f, on in (("admin", a.is_admin), ("disabled", a.disabled)) if on)
        click.echo(f"{a.login}\t{a.type}\t{flags or '-'}\t{a.owner or '-'}")


@users.command("disable")
@click.argument("login")
def users_disable(login: str) -> None:
    """Disable an account (its sessions end, its tokens stop working)."""
    from forge import websessions

    settings = _settings()

    async def go(db: Database) -> None:
        async with db.session(write=True) as session:
            account = await accounts.set_disabled(session, CLI_ACTOR, login, True)
            await websessions.destroy_all_for(session, account.id)

    _run_db(settings, go)
    click.echo(f"disabled {login}")


@users.command("set-password")
@click.argument("login")
def users_set_password(login: str) -> None:
    """Set a person's password, read from a prompt (twice) or, when stdin is not a terminal, its
    first line; never from the command line. Their browser sessions end; tokens keep working."""
    if sys.stdin.isatty():
        password = getpass.getpass(f"new password for {login}: ")
        if getpass.getpass("again: ") != password:
            raise click.UsageError("the passwords differ")
    else:
        password = sys.stdin.readline().rstrip("\r\n")
    settings = _settings()

    async def go(db: Database) -> int:
        async with db.session(write=True) as session:
            return await accounts.set_password(session, CLI_ACTOR, login, password)

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
    settings = _settings()

    async def go(db: Database) -> None:
        async with db.session(write=True) as session:
            owner_row = await accounts.require_by_login(session, owner) if owner else None
            await accounts.create_bot(session, CLI_ACTOR, login, owner=owner_row)

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
    settings = _settings()

    async def go(db: Database) -> tokens.TokenCreated:
        async with db.session(write=True) as session:
            owner = await accounts.require_by_login(session, login)
            return await tokens.create(session, CLI_ACTOR, owner, name, list(scopes), expires_days)

    created = _run_db(settings, go)
    click.echo(f"token {created.info.id} for {login} ({' '.join(created.info.scopes)}); shown once:")
    click.echo(created.token)


@tokens_group.command("list")
@click.option("--user", "login", required=True, help="Account whose tokens to list.")
@click.option("--all", "include_revoked", is_flag=True, help="Include revoked tokens.")
def tokens_list(login: str, include_revoked: bool) -> None:
    """List an account's tokens."""
    settings = _settings()

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
    settings = _settings()

    async def go(db: Database) -> None:
        async with db.session(write=True) as session:
            await tokens.revoke(session, CLI_ACTOR, token_id)

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
    from forge import repo_lifecycle
    from forge.git import RepoStore

    settings = _settings()
    repo_name = name or source.rstrip("/").rsplit("/", 1)[-1].removesuffix(".git")

    async def go(db: Database) -> str:
        store = RepoStore(settings.data_dir / "repos")
        try:
            async with db.session(write=True) as session:
                owner_row = await accounts.require_by_login(session, owner)
                repo = await repo_lifecycle.import_existing(
                    session, store, CLI_ACTOR, owner_row, repo_name, source, visibility=visibility
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
    settings = _settings()

    async def go(db: Database) -> list[audit.AuditRead]:
        async with db.session() as session:
            return list(await audit.tail(session, limit=lines))

    for r in reversed(_run_db(settings, go)):
        click.echo(
            f"{r.at:%Y-%m-%dT%H:%M:%SZ}\t{r.actor}\t{r.client_addr or '-'}\t{r.action}\t{r.target}\t{r.result}"
            f"\t{r.detail if r.detail else ''}"
        )


def _mount_optional() -> None:
    from sandbox.cli import sandbox_group
    from webhooks.cli import hooks_group

    main.add_command(sandbox_group, "sandbox")
    main.add_command(hooks_group, "hooks")


_mount_optional()


@main.command()
def worker() -> None:
    """Run the task worker in its own process (claims queued runs; start several on Docker hosts)."""
    from forge.migrate import upgrade
    from tasks.system import run_worker_process

    settings = _settings()
    upgrade(settings.effective_database_url)
    click.echo(f"forgehand worker: claiming runs from {settings.effective_database_url.split('://')[0]} database")
    freeze_startup_heap()
    asyncio.run(run_worker_process(settings))
