"""What building either image takes: a Docker client that answered, the build's progress on a
console (or silence), a build whose log feeds that progress, and what a build returns."""

import contextlib
from collections.abc import Iterator
from typing import Any

import docker
import docker.errors
import msgspec
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from sandbox.errors import EngineUnavailable, ImageBuildFailed


class BuildResult(msgspec.Struct, frozen=True, kw_only=True):
    tag: str
    image_id: str
    recipe: str  # "dockerfile", "offline", "agents" (agents_image.py) or "cached"
    built: bool  # False when an up-to-date image was already there
    seconds: float


def connect(base_url: str | None, timeout: int) -> docker.DockerClient:
    try:
        client = (
            docker.DockerClient(base_url=base_url, timeout=timeout) if base_url else docker.from_env(timeout=timeout)
        )
        client.ping()
    except docker.errors.DockerException as exc:
        raise EngineUnavailable(f"no Docker engine answered: {exc}") from exc
    return client


class Reporter:
    """Rich progress when a console is given, silence otherwise."""

    def __init__(self, console: Console | None) -> None:
        self._console = console
        self._progress: Progress | None = None
        self._task: Any = None

    @contextlib.contextmanager
    def running(self) -> Iterator["Reporter"]:
        if self._console is None:
            yield self
            return
        with Progress(
            SpinnerColumn(),
            TextColumn("[bold]{task.fields[stage]}[/bold]"),
            TextColumn("{task.description}"),
            TimeElapsedColumn(),
            console=self._console,
            transient=True,  # the stage lines stay; the live spinner row goes when done
        ) as progress:
            self._progress = progress
            self._task = progress.add_task("", stage="starting", total=None)
            try:
                yield self
            finally:
                progress.update(self._task, stage="done", description="")
                self._progress = None

    def stage(self, stage: str, detail: str = "") -> None:
        if self._progress is not None:
            self._progress.update(self._task, stage=stage, description=detail)
            self._progress.console.print(f"[bold cyan]•[/] {stage} {detail}".rstrip())

    def detail(self, line: str) -> None:
        if self._progress is not None and line.strip():
            self._progress.update(self._task, description=line.strip()[:100])


def stream_build(client: docker.DockerClient, reporter: Reporter, **kwargs: Any) -> str:
    """Run a docker build, feeding its log to the reporter; return the image id."""
    image_id = ""
    try:
        for event in client.api.build(decode=True, rm=True, forcerm=True, **kwargs):
            if "error" in event:
                raise ImageBuildFailed(f"docker build failed: {event['error'].strip()}")
            if "stream" in event:
                reporter.detail(str(event["stream"]))
            aux = event.get("aux")
            if isinstance(aux, dict) and "ID" in aux:
                image_id = str(aux["ID"])
    except docker.errors.APIError as exc:
        raise ImageBuildFailed(f"docker build failed: {exc}") from exc
    if not image_id:
        raise ImageBuildFailed("docker build finished without an image id")
    return image_id
