"""Fixtures for tests against the real Docker engine. No engine is a failure here, never a skip."""

import secrets
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import docker
import docker.errors
import pytest
from rich.console import Console

from sandbox import (
    DEFAULT_IMAGE,
    Limits,
    Sandbox,
    SandboxEngine,
    SandboxSpec,
    build_image,
    prepare_workspace,
    quota_mounts,
    remove_workspace,
)

SpecFactory = Callable[..., SandboxSpec]

# One instance label per test session, so the session can reap exactly what it made.
INSTANCE = f"test-{secrets.token_hex(4)}"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.docker)


@pytest.fixture(scope="session")
def docker_client() -> Iterator[docker.DockerClient]:
    try:
        client = docker.from_env(timeout=30)
        client.ping()
    except docker.errors.DockerException as exc:
        pytest.fail(
            f"no Docker engine answered ({exc}); the docker tests need one: start dockerd "
            "(e.g. `nohup dockerd >/tmp/dockerd.log 2>&1 &`)",
            pytrace=False,
        )
    yield client
    # Whatever a failing test left behind.
    for c in client.containers.list(all=True, filters={"label": f"forgehand.instance={INSTANCE}"}):
        c.remove(force=True)
    client.close()


@pytest.fixture(scope="session")
def sandbox_image(docker_client: docker.DockerClient) -> str:
    """The sandbox image, built once (and cached across sessions) by the same function as the CLI."""
    build_image(DEFAULT_IMAGE, console=Console(stderr=True))
    return DEFAULT_IMAGE


@pytest.fixture
async def engine(sandbox_image: str) -> AsyncIterator[SandboxEngine]:
    async with SandboxEngine() as eng:
        yield eng


@pytest.fixture(autouse=True)
def unmount_left_workspaces(tmp_path: Path) -> Iterator[None]:
    """A run cut off by a crash keeps its workspace mounted for recovery (by design); tests end clean."""
    yield
    for mounted in quota_mounts(tmp_path):
        remove_workspace(mounted)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    return prepare_workspace(tmp_path / "ws")


@pytest.fixture
def make_spec(sandbox_image: str, workspace: Path, request: pytest.FixtureRequest) -> SpecFactory:
    def make(**kw: object) -> SandboxSpec:
        base: dict[str, object] = {
            "image": sandbox_image,
            "workspace": workspace,
            "instance": INSTANCE,
            "task": "t-" + request.node.name[:40].replace("[", "-").replace("]", ""),
            "run": secrets.token_hex(4),
            "limits": Limits(wall_clock_seconds=300, exec_timeout_seconds=60),
        }
        base.update(kw)
        return SandboxSpec(**base)  # type: ignore[arg-type]

    return make


@pytest.fixture
async def sandbox(engine: SandboxEngine, make_spec: SpecFactory) -> AsyncIterator[Sandbox]:
    sb = await engine.start(make_spec())
    try:
        yield sb
    finally:
        await sb.remove()
