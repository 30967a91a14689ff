"""Fixtures for tests against the real Docker engine. No engine is a failure here, never a skip."""

import secrets
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import docker
import docker.errors
import pytest
from rich.console import Console

from sandbox import (
    DEFAULT_AGENTS_IMAGE,
    DEFAULT_IMAGE,
    Limits,
    Sandbox,
    SandboxEngine,
    SandboxSpec,
    build_agents_image,
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


@pytest.fixture(scope="session")
def agents_image(sandbox_image: str) -> str:
    """The agents image (the sandbox image plus the pinned CLIs), built once: npm needs the registry
    the first time, then the CLI comes from ~/.cache/forgehand/agents and the image from the engine."""
    build_agents_image(DEFAULT_AGENTS_IMAGE, base=sandbox_image, console=Console(stderr=True))
    return DEFAULT_AGENTS_IMAGE


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


@pytest.fixture
def channel_dir() -> Iterator[Path]:
    """A run's channel directory. Short, under /tmp: a Unix socket path must stay under 108 bytes
    (pytest's tmp_path may not)."""
    path = Path(tempfile.mkdtemp(prefix="fh-ch-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def agents_sandbox(
    engine: SandboxEngine, make_spec: SpecFactory, agents_image: str, channel_dir: Path
) -> AsyncIterator[Sandbox]:
    """A sandbox of the agents image with the channel directory mounted at /run/forgehand."""
    sb = await engine.start(make_spec(image=agents_image, channel_dir=channel_dir))
    try:
        yield sb
    finally:
        await sb.remove()
