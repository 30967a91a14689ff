"""`forgehand doctor`: one line per check of forge.app.doctor (OK, WARN or FAIL, and for anything
not OK the fix), or with `--json` the list; exit status 1 when any check FAILs (a WARN does not)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from forge.app.doctor import Check


def _line(c: Check) -> str:
    text = f"{c.status:<4}  {c.check:<13} {c.detail}"
    return f"{text}  -> {c.fix}" if c.fix and c.status != "OK" else text


@click.command("doctor")
@click.option(
    "--json", "as_json", is_flag=True, help="Print the checks as a JSON list of {check, status, detail, fix}."
)
@click.pass_context
def doctor(ctx: click.Context, as_json: bool) -> None:
    """Check what this instance needs (settings, data, database, Docker, allow-lists, clock)."""
    import msgspec

    from forge.app.doctor import run_checks

    checks = run_checks(ctx.find_root().params.get("data_dir"))
    if as_json:
        click.echo(msgspec.json.encode(checks).decode())
    else:
        for c in checks:
            click.echo(_line(c))
    if any(c.status == "FAIL" for c in checks):
        ctx.exit(1)
