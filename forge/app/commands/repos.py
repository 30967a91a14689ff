"""`forgehand repos`: repositories from the command line (import one from this machine)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from forge.app.commands.context import cli_actor, instance_settings, run_db

if TYPE_CHECKING:
    from forge.db.engine import Database


@click.group("repos")
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

    settings = instance_settings()
    repo_name = name or source.rstrip("/").rsplit("/", 1)[-1].removesuffix(".git")

    async def go(db: Database) -> str:
        store = RepoStore(settings.data_dir / "repos")
        try:
            async with db.session(write=True) as session:
                owner_row = await accounts.require_by_login(session, owner)
                repo = await lifecycle.import_existing(
                    session, store, cli_actor(), owner_row, repo_name, source, visibility=visibility
                )
                return f"{owner_row.login}/{repo.name} (default branch {repo.default_branch})"
        finally:
            await store.close()

    click.echo(f"imported {run_db(settings, go)}")
