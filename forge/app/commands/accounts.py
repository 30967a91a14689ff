"""`forgehand users`, `forgehand bots` and `forgehand tokens`: accounts and their tokens, from the
command line."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click

from forge.app.commands.context import cli_actor, instance_settings, prompt_twice, run_db

if TYPE_CHECKING:
    from forge.accounts import accounts, tokens
    from forge.db.engine import Database


@click.group()
def users() -> None:
    """Manage people's accounts."""


@users.command("create")
@click.argument("login")
@click.option("--admin", is_flag=True, help="Make an instance admin.")
@click.option("--password", default=None, help="Password (prompted when interactive; generated otherwise).")
def users_create(login: str, admin: bool, password: str | None) -> None:
    """Create a person's account."""
    from forge.accounts import accounts

    settings = instance_settings()  # before any prompt: a wrong data directory is said first
    generated = False
    if password is None:
        if sys.stdin.isatty():
            password = prompt_twice(f"password for {login}: ")
        else:
            from forge.core.security import generate_password

            password, generated = generate_password(), True
    pw = password

    async def go(db: Database) -> None:
        async with db.session(write=True) as session:
            await accounts.create_user(session, cli_actor(), login, pw, is_admin=admin, must_change_password=generated)

    run_db(settings, go)
    click.echo(f"created user {login}" + (" (admin)" if admin else ""))
    if generated:
        click.echo(f"password: {password}  (generated: {login} must change it at the first sign-in)")


@users.command("list")
def users_list() -> None:
    """List accounts (people and bots): a header line, then one tab-separated line per account."""
    from forge.accounts import accounts

    settings = instance_settings()

    async def go(db: Database) -> list[accounts.AccountRead]:
        async with db.session() as session:
            return [await accounts.to_read(session, a) for a in await accounts.list_accounts(session)]

    listed = run_db(settings, go)
    click.echo("login\ttype\tflags\towner")
    for a in listed:
        flags = ",".join(f for f, on in (("admin", a.is_admin), ("disabled", a.disabled)) if on)
        click.echo(f"{a.login}\t{a.type}\t{flags or '-'}\t{a.owner or '-'}")


@users.command("disable")
@click.argument("login")
def users_disable(login: str) -> None:
    """Disable an account (its sessions end, its tokens stop working)."""
    from forge.accounts import accounts, websessions

    settings = instance_settings()

    async def go(db: Database) -> None:
        async with db.session(write=True) as session:
            account = await accounts.set_disabled(session, cli_actor(), login, True)
            await websessions.destroy_all_for(session, account.id)

    run_db(settings, go)
    click.echo(f"disabled {login}")


@users.command("set-password")
@click.argument("login")
def users_set_password(login: str) -> None:
    """Set a person's password, read from a prompt (twice) or, when stdin is not a terminal, its
    first line; never from the command line. Their browser sessions end; tokens keep working."""
    from forge.accounts import accounts

    settings = instance_settings()
    if sys.stdin.isatty():
        password = prompt_twice(f"new password for {login}: ")
    else:
        password = sys.stdin.readline().rstrip("\r\n")

    async def go(db: Database) -> int:
        async with db.session(write=True) as session:
            return await accounts.set_password(session, cli_actor(), login, password)

    ended = run_db(settings, go)
    click.echo(f"password of {login} set ({ended} session(s) signed out)")


@click.group()
def bots() -> None:
    """Manage bot accounts (they act only through tokens)."""


@bots.command("create")
@click.argument("login")
@click.option("--owner", default=None, help="Login of the person responsible for the bot.")
def bots_create(login: str, owner: str | None) -> None:
    """Create a bot account."""
    from forge.accounts import accounts

    settings = instance_settings()

    async def go(db: Database) -> None:
        async with db.session(write=True) as session:
            owner_row = await accounts.require_by_login(session, owner) if owner else None
            await accounts.create_bot(session, cli_actor(), login, owner=owner_row)

    run_db(settings, go)
    click.echo(f"created bot {login}")


@click.group("tokens")
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

    settings = instance_settings()

    async def go(db: Database) -> tokens.TokenCreated:
        async with db.session(write=True) as session:
            owner = await accounts.require_by_login(session, login)
            return await tokens.create(session, cli_actor(), owner, name, list(scopes), expires_days)

    created = run_db(settings, go)
    click.echo(f"token {created.info.id} for {login} ({' '.join(created.info.scopes)}); shown once:")
    click.echo(created.token)


@tokens_group.command("list")
@click.option("--user", "login", required=True, help="Account whose tokens to list.")
@click.option("--all", "include_revoked", is_flag=True, help="Include revoked tokens.")
def tokens_list(login: str, include_revoked: bool) -> None:
    """List an account's tokens."""
    from forge.accounts import accounts, tokens

    settings = instance_settings()

    async def go(db: Database) -> list[tokens.TokenRead]:
        async with db.session() as session:
            owner = await accounts.require_by_login(session, login)
            return await tokens.list_for(session, owner, include_revoked=include_revoked)

    for t in run_db(settings, go):
        state = "revoked" if t.revoked else (f"expires {t.expires_at:%Y-%m-%d}" if t.expires_at else "no expiry")
        click.echo(f"{t.id}\t{t.name}\t...{t.last_eight}\t{','.join(t.scopes)}\t{state}")


@tokens_group.command("revoke")
@click.argument("token_id", type=int)
def tokens_revoke(token_id: int) -> None:
    """Revoke a token by id."""
    from forge.accounts import tokens

    settings = instance_settings()

    async def go(db: Database) -> None:
        async with db.session(write=True) as session:
            await tokens.revoke(session, cli_actor(), token_id)

    run_db(settings, go)
    click.echo(f"revoked token {token_id}")
