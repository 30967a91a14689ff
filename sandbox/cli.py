"""`forgehand sandbox ...` commands (mounted by forge.cli)."""

import click


@click.group("sandbox")
def sandbox_group() -> None:
    """Build, list and reap sandbox images and containers."""
