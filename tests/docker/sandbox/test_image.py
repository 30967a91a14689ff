"""The sandbox image: built by the package, cached, and shaped as the issue asks."""

import time

import docker

from sandbox import DEFAULT_IMAGE, IMAGE_VERSION, Sandbox, build_image
from sandbox.images.sandbox_image import VERSION_LABEL


def test_build_is_cached(sandbox_image: str) -> None:
    t0 = time.monotonic()
    result = build_image(sandbox_image)
    assert result.built is False
    assert result.recipe == "cached"
    assert time.monotonic() - t0 < 5


def test_image_labels_user_and_workdir(docker_client: docker.DockerClient, sandbox_image: str) -> None:
    assert sandbox_image == DEFAULT_IMAGE
    cfg = docker_client.images.get(sandbox_image).attrs["Config"]
    assert cfg["Labels"][VERSION_LABEL] == IMAGE_VERSION
    assert cfg["User"] == "1000:1000"
    assert cfg["WorkingDir"] == "/workspace"


async def test_image_contents(sandbox: Sandbox) -> None:
    r = await sandbox.exec(
        [
            "bash",
            "-c",
            "id -u; id -g; id -un; stat -c '%u:%g' /workspace; echo $HOME;"
            "git --version >/dev/null && python3 -c 'print(1)' && rg --version >/dev/null && echo tools-ok;"
            "test -r /etc/ssl/certs/ca-certificates.crt && echo certs-ok;"
            "find / -xdev -perm /6000 -type f 2>/dev/null | wc -l",
        ]
    )
    assert r.exit_code == 0, r
    assert r.stdout.decode().split() == [
        "1000",
        "1000",
        "agent",
        "1000:1000",
        "/home/agent",
        "1",
        "tools-ok",
        "certs-ok",
        "0",
    ]
