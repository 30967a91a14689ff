"""The application image (deploy/app, deploy/scripts/build-app-image) on the real engine: built
offline from the sandbox image's base, or reused when its recipe label matches, then one container
on a SQLite data volume: /healthz answers through a published port, the server runs as uid 10001,
the image's HEALTHCHECK command passes and `forgehand doctor` prints its checks (no engine inside)."""

import contextlib
import secrets
import subprocess
import sys
import time
from pathlib import Path

import docker
import docker.errors
import httpx
import pytest

from tests.docker.conftest import INSTANCE

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "deploy" / "scripts" / "build-app-image"

# One build (or a cache hit) for the whole suite: the group keeps it on one xdist worker.
pytestmark = pytest.mark.xdist_group("app_image")


def build_app_image() -> str:
    return run_build_script(BUILD)


def run_build_script(script: Path) -> str:
    """One of deploy/scripts' image builds (cached on its recipe label): the tag it printed last."""
    done = subprocess.run(
        [str(script)],
        env={"PATH": "/usr/local/bin:/usr/bin:/bin", "VENV": sys.prefix, "HOME": str(Path.home())},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout.strip().splitlines()[-1]


def wait_healthy(url: str, container: docker.models.containers.Container, seconds: float = 120) -> httpx.Response:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            r = httpx.get(url, timeout=5)
            if r.status_code == 200:
                return r
        except httpx.TransportError:
            pass
        container.reload()
        assert container.status in ("created", "running"), container.logs().decode()[-4000:]
        time.sleep(0.5)
    pytest.fail(f"{url} did not answer 200 in {seconds}s:\n{container.logs().decode()[-4000:]}")


def test_app_image_serves_as_non_root_and_runs_doctor(docker_client: docker.DockerClient, sandbox_image: str) -> None:
    tag = build_app_image()
    image = docker_client.images.get(tag)
    cfg = image.attrs["Config"]
    assert cfg["User"] == "10001:10001"
    assert cfg["Cmd"] == ["forgehand", "serve"]
    assert "8000/tcp" in cfg["ExposedPorts"]
    assert "/var/lib/forgehand" in cfg["Volumes"]
    assert "/healthz" in " ".join(cfg["Healthcheck"]["Test"])
    assert cfg["Labels"]["org.forgehand.app.recipe"]
    # A second build with nothing changed is a cache hit (what CI pays for after the first run).
    t0 = time.monotonic()
    assert build_app_image() == tag
    assert time.monotonic() - t0 < 30

    volume = docker_client.volumes.create(
        f"forgehand-app-test-{secrets.token_hex(4)}", labels={"forgehand.instance": INSTANCE}
    )
    container = docker_client.containers.run(
        tag,
        detach=True,
        labels={"forgehand.instance": INSTANCE},
        volumes={volume.name: {"bind": "/var/lib/forgehand", "mode": "rw"}},
        ports={"8000/tcp": ("127.0.0.1", None)},
        environment={"FORGEHAND_SEED_DEMO": "false"},
    )
    try:
        container.reload()
        port = container.ports["8000/tcp"][0]["HostPort"]
        r = wait_healthy(f"http://127.0.0.1:{port}/healthz", container)
        # No Docker socket in this container: the server serves, and says its worker cannot claim.
        body = r.json()
        assert body["status"] == "degraded", body
        assert body["workers"] == {"claiming": 0, "engine_unreachable": 1, "lost": 0}, body

        # PID 1 is `forgehand serve` (exec form), as the image's non-root user.
        status = container.exec_run(["cat", "/proc/1/status"]).output.decode()
        uid_line = next(line for line in status.splitlines() if line.startswith("Uid:"))
        assert uid_line.split()[1:] == ["10001"] * 4
        cmdline = container.exec_run(["cat", "/proc/1/cmdline"]).output.split(b"\0")
        assert b"serve" in cmdline

        # The HEALTHCHECK's own command, run now rather than waiting out its interval.
        health = container.exec_run(["sh", "-c", cfg["Healthcheck"]["Test"][1]])
        assert health.exit_code == 0, health.output

        doctor = container.exec_run(["forgehand", "doctor"])
        out = doctor.output.decode()
        assert doctor.exit_code in (0, 1), out
        lines = {line.split()[1]: line.split()[0] for line in out.splitlines() if line.strip()}
        assert lines["database"] == "OK", out
        assert lines["data-dir"] == "OK", out
        assert lines["docker"] in ("WARN", "FAIL"), out  # no engine inside the web container
    finally:
        container.remove(force=True)
        with contextlib.suppress(docker.errors.APIError):
            volume.remove(force=True)
