"""Environment images on the real engine: the setup runs once, its /opt/env is committed and a
normal hardened sandbox runs what it installed; failures, timeouts and leaked secrets commit nothing."""

import asyncio
import json
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path

import docker
import docker.errors
import pytest

from sandbox import SandboxEngine
from sandbox.environment import secret_scan
from sandbox.environment.build import (
    REASON_DISK,
    REASON_SECRET,
    REASON_SETUP,
    REASON_TIMED_OUT,
    BuildResult,
    build_environment,
)
from sandbox.environment.images import prune_images
from sandbox.environment.spec import EnvironmentSpec
from tests.docker.conftest import INSTANCE, SpecFactory

LABEL = "forgehand.test-environment"
TOKEN = "tok-" + secrets.token_hex(14)  # 32 characters: one line of `base64` output

Build = Callable[..., tuple[BuildResult, str]]


@pytest.fixture
def build(docker_client: docker.DockerClient, sandbox_image: str, workspace: Path) -> Iterator[Build]:
    """Builds an environment on the sandbox image into a fresh tag; removes every image it made."""
    tags: list[str] = []

    def run(
        setup: str, *, env: dict[str, str] | None = None, timeout: float = 60, **kw: object
    ) -> tuple[BuildResult, str]:
        tag = f"forgehand-env-test:{secrets.token_hex(6)}"
        tags.append(tag)
        spec = EnvironmentSpec(image=sandbox_image, setup=setup, env=env or {}, setup_secrets=("TOKEN",))
        result = build_environment(
            docker_client,
            spec,
            base_image=sandbox_image,
            tag=tag,
            workspace=workspace,
            secrets={"TOKEN": TOKEN},
            labels={LABEL: INSTANCE},
            instance=INSTANCE,
            timeout=timeout,
            **kw,  # type: ignore[arg-type]
        )
        return result, tag

    yield run
    for image in docker_client.images.list(filters={"label": f"{LABEL}={INSTANCE}"}):
        docker_client.images.remove(image.id, force=True)
    for tag in tags:
        with pytest.raises(docker.errors.ImageNotFound):
            docker_client.images.get(tag)


def assert_no_image(client: docker.DockerClient, tag: str) -> None:
    with pytest.raises(docker.errors.ImageNotFound):
        client.images.get(tag)


def no_build_containers(client: docker.DockerClient) -> bool:
    return not client.containers.list(
        all=True, filters={"label": ["forgehand.task=environment", f"forgehand.instance={INSTANCE}"]}
    )


SETUP = """
mkdir -p /opt/env/bin
printf '#!/bin/sh\\necho "hello from $GREETING"\\n' > /opt/env/bin/hello
chmod +x /opt/env/bin/hello
wc -c < /run/secrets/TOKEN > /opt/env/token-length
echo scratch > /tmp/not-kept
echo "setup done"
"""


async def test_built_image_runs_in_a_hardened_sandbox(
    build: Build, docker_client: docker.DockerClient, engine: SandboxEngine, make_spec: SpecFactory
) -> None:
    result, tag = await asyncio.to_thread(build, SETUP, env={"GREETING": "the environment"})
    assert result.ok and result.reason == "" and result.exit_code == 0, result
    assert "setup done" in result.log_tail and result.image_id
    assert no_build_containers(docker_client)

    image = docker_client.images.get(tag)
    config = image.attrs["Config"]
    assert image.labels[LABEL] == INSTANCE
    assert image.labels.get("forgehand.weakened", "") == ""  # the build's writable root is not inherited
    assert "GREETING=the environment" in config["Env"]
    assert any(e.startswith("PATH=") and e.endswith(":/opt/env/bin") for e in config["Env"])
    assert config["User"] == "1000:1000" and config["Cmd"] == ["sleep", "infinity"]
    # The secret was readable by the setup, and is nowhere in the image's config or history.
    everything = json.dumps([image.attrs, docker_client.api.history(tag)])
    assert TOKEN not in everything

    sb = await engine.start(make_spec(image=tag))
    try:
        r = await sb.exec(["hello"])
        assert (r.exit_code, r.stdout) == (0, b"hello from the environment\n")
        r = await sb.exec(["sh", "-c", "cat /opt/env/token-length; ls /tmp; ls -A /run/secrets; touch /opt/env/x"])
        assert r.stdout.split() == [str(len(TOKEN)).encode()]  # nothing in /tmp, no secret files
        assert r.exit_code != 0 and b"Read-only file system" in r.stderr  # a normal, read-only root
    finally:
        await sb.remove()


def test_failing_setup_commits_nothing(build: Build, docker_client: docker.DockerClient) -> None:
    result, tag = build("echo installing; echo broken >&2; exit 3")
    assert (result.ok, result.reason, result.exit_code) == (False, REASON_SETUP, 3)
    assert "installing" in result.log_tail and "broken" in result.log_tail
    assert_no_image(docker_client, tag)
    assert no_build_containers(docker_client)


def test_setup_past_its_timeout_is_killed(build: Build, docker_client: docker.DockerClient) -> None:
    # The hang is the scenario: the setup never ends by itself.
    result, tag = build("echo started; exec sleep 600", timeout=2)
    assert (result.ok, result.reason, result.exit_code) == (False, REASON_TIMED_OUT, None)
    assert "started" in result.log_tail and result.seconds < 60
    assert_no_image(docker_client, tag)
    assert no_build_containers(docker_client)


@pytest.mark.parametrize(
    "leak",
    [
        "cp /run/secrets/TOKEN /opt/env/token.txt",
        "mkdir -p /opt/env/share && base64 /run/secrets/TOKEN > /opt/env/share/t.b64",
        # Encoded after a prefix: another alignment of the value in the base64 text.
        'printf "machine x password %s\\n" "$(cat /run/secrets/TOKEN)" | base64 -w0 > /var/tmp/netrc.b64',
        'ln -s "/$(cat /run/secrets/TOKEN)" /opt/env/link',
    ],
    ids=["copy", "base64", "base64-offset", "symlink-target"],
)
def test_secret_left_in_the_image_refuses_the_build(
    build: Build, docker_client: docker.DockerClient, leak: str
) -> None:
    result, tag = build(leak)
    assert (result.ok, result.reason, result.secret) == (False, REASON_SECRET, "TOKEN"), result
    assert TOKEN not in result.log_tail
    assert_no_image(docker_client, tag)
    assert no_build_containers(docker_client)


def test_secret_in_the_declared_env_refuses_the_build(build: Build, docker_client: docker.DockerClient) -> None:
    result, tag = build("true", env={"API_KEY": TOKEN})
    assert (result.ok, result.reason) == (False, REASON_SECRET)
    assert_no_image(docker_client, tag)


def test_a_setup_that_writes_past_its_disk_limit_is_stopped_and_keeps_nothing(
    build: Build, docker_client: docker.DockerClient
) -> None:
    """One burst (faster than the watchdog looks) and a steady writer: both end `disk_limit`."""
    burst, burst_tag = build("head -c 24M /dev/zero > /opt/env/big", disk_bytes=16 * 1024 * 1024)
    steady, steady_tag = build(
        "i=0; while true; do i=$((i+1)); head -c 4M /dev/zero > /opt/env/f$i; done", disk_bytes=16 * 1024 * 1024
    )
    assert (burst.ok, burst.reason) == (False, REASON_DISK)
    assert (steady.ok, steady.reason, steady.exit_code) == (False, REASON_DISK, None)
    assert_no_image(docker_client, burst_tag)
    assert_no_image(docker_client, steady_tag)


def test_old_environment_images_go_first_past_the_bound(build: Build, docker_client: docker.DockerClient) -> None:
    """Three images of 4 MiB of their own each, a bound of 9 MiB: the oldest goes, the newest
    (just built) is never taken, and images of other labels are not looked at."""
    made = [build(f"head -c 4M /dev/urandom > /opt/env/data{i}")[1] for i in range(3)]
    removed = prune_images(docker_client, {LABEL: INSTANCE}, 9 * 1024 * 1024, keep=made[-1])
    left = {tag for tag in made if docker_client.images.list(name=tag)}
    assert left == set(made[1:]) and len(removed) == 1
    assert prune_images(docker_client, {LABEL: INSTANCE}, 0, keep=made[-1]) and {
        tag for tag in made if docker_client.images.list(name=tag)
    } == {made[-1]}


def test_a_secret_is_found_through_the_engine_when_the_layer_is_not_on_this_host(
    build: Build, docker_client: docker.DockerClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scan reads the layer's directory when the engine keeps it here; without it (a remote
    engine, no permission), it reads the changes back through the engine and finds the same."""
    monkeypatch.setattr(secret_scan, "upper_dir", lambda client, container_id: None)
    result, tag = build("mkdir -p /opt/env/deep/er && cat /run/secrets/TOKEN > /opt/env/deep/er/t.txt")
    assert (result.ok, result.reason) == (False, REASON_SECRET)
    assert_no_image(docker_client, tag)
