"""`forgehand sandbox ...` commands (mounted by forge.app.cli). Importing this module loads click and
the image names only: the Docker SDK and rich are imported by the command that runs, so that
`forgehand sandbox --help` is quick."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, cast

import click

from .images.names import DEFAULT_AGENTS_IMAGE, DEFAULT_IMAGE

if TYPE_CHECKING:
    from rich.console import Console

    from .errors import SandboxError
    from .images.sandbox_image import Recipe
    from .reaper import SandboxInfo


def _console() -> Console:
    from rich.console import Console

    return Console(stderr=True)


def _fail(exc: SandboxError) -> None:
    _console().print(f"[red]error:[/red] {exc}")
    sys.exit(1)


@click.group("sandbox")
def sandbox_group() -> None:
    """Build, list and reap sandbox images and containers."""


@sandbox_group.command("build")
@click.option("--force", is_flag=True, help="Rebuild even when the image is up to date.")
@click.option(
    "--agents",
    is_flag=True,
    help=f"Build the agents image ({DEFAULT_AGENTS_IMAGE}: the sandbox image plus the pinned agent CLIs).",
)
@click.option(
    "--image",
    "tag",
    default=None,
    help=f"Tag to build [default: {DEFAULT_IMAGE}, or {DEFAULT_AGENTS_IMAGE} with --agents].",
)
@click.option(
    "--recipe",
    type=click.Choice(["auto", "dockerfile", "offline"]),
    default="auto",
    show_default=True,
    help="auto pulls debian:bookworm-slim and falls back to debootstrap when the pull fails.",
)
@click.option("--docker-host", envvar="DOCKER_HOST", default=None, help="Docker engine URL.")
def build_cmd(force: bool, agents: bool, tag: str | None, recipe: str, docker_host: str | None) -> None:
    """Build the sandbox image, or with --agents the agents image (cached; skipped when current)."""
    from .errors import SandboxError
    from .images.agents_image import build_agents_image
    from .images.sandbox_image import build_image

    console = _console()
    try:
        if agents:
            # The plain image it starts FROM is built with the default recipe when missing.
            result = build_agents_image(tag or DEFAULT_AGENTS_IMAGE, force=force, base_url=docker_host, console=console)
        else:
            result = build_image(
                tag or DEFAULT_IMAGE, force=force, recipe=cast("Recipe", recipe), base_url=docker_host, console=console
            )
    except SandboxError as exc:
        _fail(exc)
        return
    if result.built:
        console.print(
            f"[green]built[/green] {result.tag} ({result.image_id[:19]}) "
            f"with the {result.recipe} recipe in {result.seconds:.1f}s"
        )


LS_COLUMNS = ("container", "instance", "task", "run", "status", "created", "weakened", "creator")


def ls_rows(rows: list[SandboxInfo]) -> list[tuple[str, ...]]:
    """One row of LS_COLUMNS per sandbox, every value whole."""
    import datetime as dt

    out: list[tuple[str, ...]] = []
    for row in rows:
        created = dt.datetime.fromtimestamp(row.created, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S")
        creator = "gone" if row.orphaned else (row.host or "-")
        out.append((row.name, row.instance, row.task, row.run, row.status, created, row.weakened or "-", creator))
    return out


def print_rows(columns: tuple[str, ...], rows: list[tuple[str, ...]], *, terminal: bool) -> None:
    """A table on a terminal; otherwise (a pipe, a file) a header line and one tab-separated line
    per row with every value in full, for grep, cut and awk."""
    if terminal:
        from rich.console import Console
        from rich.table import Table

        table = Table(*columns)
        for row in rows:
            table.add_row(*row)
        Console().print(table)
        return
    for line in (columns, *rows):
        click.echo("\t".join(line))


@sandbox_group.command("ls")
@click.option("--instance", default=None, help="Only this forgehand instance's sandboxes.")
@click.option("--docker-host", envvar="DOCKER_HOST", default=None, help="Docker engine URL.")
def ls_cmd(instance: str | None, docker_host: str | None) -> None:
    """List sandbox containers (running or not): a table on a terminal, tab-separated lines with a
    header line otherwise."""
    import asyncio

    from .engine import SandboxEngine
    from .errors import SandboxError
    from .reaper import list_sandboxes

    async def run() -> list[SandboxInfo]:
        async with SandboxEngine(docker_host) as engine:
            return await list_sandboxes(engine, instance)

    try:
        rows = asyncio.run(run())
    except SandboxError as exc:
        _fail(exc)
        return
    print_rows(LS_COLUMNS, ls_rows(rows), terminal=sys.stdout.isatty())


@sandbox_group.command("reap")
@click.option(
    "--instance",
    envvar="FORGEHAND_INSTANCE_ID",
    default=None,
    help="The forgehand instance whose sandboxes to remove (default: $FORGEHAND_INSTANCE_ID).",
)
@click.option("--keep", multiple=True, help="Run id to keep (repeatable).")
@click.option("--docker-host", envvar="DOCKER_HOST", default=None, help="Docker engine URL.")
def reap_cmd(instance: str | None, keep: tuple[str, ...], docker_host: str | None) -> None:
    """Remove every sandbox of an instance except the kept runs, and any whose creator is gone."""
    if not instance:
        # Never every instance at once: another forgehand on this engine would lose its sandboxes.
        raise click.UsageError("name the instance: --instance ID or FORGEHAND_INSTANCE_ID (see `forgehand sandbox ls`)")
    import asyncio

    from .engine import SandboxEngine
    from .errors import SandboxError
    from .reaper import reap

    console = _console()

    async def run() -> int:
        async with SandboxEngine(docker_host) as engine:
            removed = await reap(engine, instance, set(keep))
        for row in removed:
            console.print(f"removed {row.name} (task {row.task}, run {row.run}, {row.status})")
        return len(removed)

    try:
        count = asyncio.run(run())
    except SandboxError as exc:
        _fail(exc)
        return
    console.print(f"[green]{count}[/green] sandbox(es) removed")
