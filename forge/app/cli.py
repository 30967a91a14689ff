"""The `forgehand` command: the root group, and the commands that start or create an instance
(`serve`, `worker`, `db upgrade`); the groups that work on one are in `forge.app.commands`. Errors
are one clear line on stderr and exit status 2.

Importing this module is cheap: `forgehand --help` and every command's help load click, this file
and the command groups only. Whatever a command needs (the database, the app, Docker, the webhooks
consumer) is imported inside the command, and the `sandbox` and `hooks` groups are loaded when
invoked."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from forge.app.commands.accounts import bots, tokens_group, users
from forge.app.commands.audit import audit_group
from forge.app.commands.context import run_db, start_settings
from forge.app.commands.db_copy import copy_command
from forge.app.commands.repos import repos_group

if TYPE_CHECKING:
    from forge.core.settings import Settings
    from forge.db.engine import Database

# Groups that live in other packages: (module, attribute, one-line help shown by `forgehand --help`
# without importing them).
LAZY_GROUPS = {
    "hooks": ("webhooks.cli", "hooks_group", "Webhook tools: the reference consumer."),
    "sandbox": ("sandbox.cli", "sandbox_group", "Build, list and reap sandbox images and containers."),
    "doctor": (
        "forge.app.commands.doctor",
        "doctor",
        "Check what this instance needs (settings, data, database, Docker, allow-lists, clock).",
    ),
    "backup": ("forge.app.commands.backup", "backup_command", "Back up the instance (database, repositories, key)."),
    "restore": ("forge.app.commands.backup", "restore_command", "Restore a backup into a fresh data directory."),
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

    settings = start_settings(host=host, port=port)
    upgrade(settings.effective_database_url)
    password = run_db(settings, lambda db: bootstrap.ensure_admin(db, settings))
    if password:
        click.echo("")
        click.echo("  First start: an instance admin was created.")
        click.echo(f"  login:    {bootstrap.ADMIN_LOGIN}")
        click.echo(f"  password: {password}")
        click.echo(f"  (also in {settings.data_dir / bootstrap.PASSWORD_FILE}, mode 0600, until you change it)")
        click.echo("  Sign in and choose your own password: the first page asks for it.")
        click.echo("")
    if settings.seed_demo and password:
        demo_name = run_db(settings, lambda db: _seed_demo(db, settings))
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

    settings = start_settings()
    upgrade(settings.effective_database_url)
    click.echo("database is up to date")


db.add_command(copy_command)


def _checked_labels(value: str | None) -> str | None:
    from forge.core.worker_labels import parse_labels

    if value is None:
        return None
    try:
        return ",".join(parse_labels(value))
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


@main.command()
@click.option(
    "--labels",
    default=None,
    metavar="LABEL,...",
    callback=lambda _ctx, _param, value: _checked_labels(value),
    help="Labels this worker offers, e.g. gpu,large: it claims only runs whose task requires none it lacks"
    " (FORGEHAND_WORKER_LABELS, default none).",
)
@click.option(
    "--capacity",
    type=click.IntRange(min=1),
    default=None,
    help="How many runs this worker runs at once (FORGEHAND_WORKER_CAPACITY, default FORGEHAND_TASK_CONCURRENCY).",
)
def worker(labels: str | None, capacity: int | None) -> None:
    """Run the task worker in its own process (claims queued runs; start several on Docker hosts)."""
    import asyncio

    from forge.app.heap import freeze_startup_heap
    from forge.db.migrate import upgrade
    from tasks.system import run_worker_process

    settings = start_settings(worker_labels=labels, worker_capacity=capacity)
    upgrade(settings.effective_database_url)
    offers = ", ".join(sorted(settings.worker_label_set)) or "no labels"
    click.echo(
        f"forgehand worker: claiming runs from {settings.effective_database_url.split('://')[0]} database"
        f" ({offers}; up to {settings.effective_worker_capacity} at once)"
    )
    freeze_startup_heap()
    asyncio.run(run_worker_process(settings))


for _group in (users, bots, tokens_group, repos_group, audit_group):
    main.add_command(_group)
