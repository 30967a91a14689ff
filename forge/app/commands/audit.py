"""`forgehand audit`: the audit log from the command line."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from forge.app.commands.context import instance_settings, run_db

if TYPE_CHECKING:
    from forge.db import audit
    from forge.db.engine import Database


@click.group("audit")
def audit_group() -> None:
    """Read the audit log."""


@audit_group.command("tail")
@click.option("-n", "--lines", default=20, show_default=True, help="How many rows, newest last.")
def audit_tail(lines: int) -> None:
    """Show the newest audit rows."""
    from forge.db import audit

    settings = instance_settings()

    async def go(db: Database) -> list[audit.AuditRead]:
        async with db.session() as session:
            return list(await audit.tail(session, limit=lines))

    for r in reversed(run_db(settings, go)):
        click.echo(
            f"{r.at:%Y-%m-%dT%H:%M:%SZ}\t{r.actor}\t{r.client_addr or '-'}\t{r.action}\t{r.target}\t{r.result}"
            f"\t{r.detail if r.detail else ''}"
        )
