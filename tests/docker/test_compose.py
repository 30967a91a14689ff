"""deploy/compose.yaml as an operator runs it, on the real engine: the application image and the
PostgreSQL image built here (deploy/scripts/build-app-image, build-postgres-image; nothing pulled),
`compose up` with the file unchanged (only its documented variables set), then what the operator
checks: both web replicas answer /healthz `ok` and count the one worker that claims; the admin's
token made with `forgehand tokens create` inside a web container; a repository made through
replica 1, a task started through replica 2 and run by the compose worker in a sandbox on the
host's engine (`runs[].worker` names it); the task branch cloned with the git CLI over smart HTTP
from replica 1 holds the command's file. `compose down -v` removes everything again."""

import contextlib
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import docker
import docker.errors
import httpx
import pytest

from tests.docker.test_app_image import build_app_image, run_build_script

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "deploy" / "compose.yaml"
BUILD_POSTGRES = ROOT / "deploy" / "scripts" / "build-postgres-image"
T = TypeVar("T")

# The app image's build (or cache hit) is shared with test_app_image: one xdist worker for both.
pytestmark = pytest.mark.xdist_group("app_image")


def compose_command() -> list[str]:
    """The Compose CLI this host has: the `docker compose` plugin, or the standalone docker-compose
    (deploy/scripts/provision-test-host installs Debian's when neither is there)."""
    if subprocess.run(["docker", "compose", "version"], capture_output=True, timeout=30).returncode == 0:
        return ["docker", "compose"]
    found = shutil.which("docker-compose")
    assert found, "no Docker Compose here: run deploy/scripts/provision-test-host (installs docker-compose)"
    return [found]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Stack:
    project: str
    env: dict[str, str]
    web: list[str]  # the two replicas' base URLs
    data_dir: Path

    def compose(self, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        cmd = [*compose_command(), "-p", self.project, "-f", str(COMPOSE_FILE), *args]
        done = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=timeout)
        assert done.returncode == 0, f"{' '.join(args)}: {done.stdout[-2000:]}{done.stderr[-4000:]}"
        return done

    def logs(self) -> str:
        cmd = [*compose_command(), "-p", self.project, "-f", str(COMPOSE_FILE), "logs", "--no-color", "--tail=40"]
        return subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=60).stdout[-6000:]


@pytest.fixture
def stack(sandbox_image: str) -> Iterator[Stack]:
    build_app_image()
    postgres_image = run_build_script(BUILD_POSTGRES)
    # Under /var/tmp, not pytest's 0700 tmp: uid 10001 in the containers walks down to its directories.
    top = Path(tempfile.mkdtemp(prefix="fh-compose-", dir="/var/tmp"))
    made: Stack | None = None
    try:
        top.chmod(0o755)
        for sub in ("data", "runs"):
            (top / sub).mkdir(mode=0o750)
            os.chown(top / sub, 10001, 10001)
        ports = [free_port(), free_port()]
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(Path.home()),
            "POSTGRES_PASSWORD": secrets.token_urlsafe(16),
            "DOCKER_GID": str(os.stat("/var/run/docker.sock").st_gid),
            "FORGEHAND_POSTGRES_IMAGE": postgres_image,
            "FORGEHAND_DATA_DIR": str(top / "data"),
            "FORGEHAND_RUN_CHANNEL_DIR": str(top / "runs"),
            "FORGEHAND_WEB1_PORT": str(ports[0]),
            "FORGEHAND_WEB2_PORT": str(ports[1]),
            "FORGEHAND_BASE_URL": f"http://127.0.0.1:{ports[0]}",
        }
        made = Stack(f"fhsmoke{secrets.token_hex(4)}", env, [f"http://127.0.0.1:{p}" for p in ports], top / "data")
        made.compose("up", "-d")
        yield made
    finally:
        try:
            if made is not None:
                made.compose("down", "-v", "--remove-orphans", "--timeout", "10")
        finally:
            remove_sandboxes_of(top / "data")
            shutil.rmtree(top, ignore_errors=True)


def remove_sandboxes_of(data_dir: Path) -> None:
    """The sandboxes the compose worker started on this host's engine (compose knows nothing of
    them): a run cut off by the test's end or failure leaves its container behind otherwise."""
    with contextlib.suppress(OSError):
        instance = (data_dir / "instance_id").read_text().strip()
        client = docker.from_env(timeout=30)
        try:
            for container in client.containers.list(all=True, filters={"label": f"forgehand.instance={instance}"}):
                with contextlib.suppress(docker.errors.APIError):
                    container.remove(force=True)
        finally:
            client.close()


def wait_for(what: str, check: Callable[[], T | None], stack: Stack, seconds: float = 120) -> T:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.TransportError):
            found = check()
            if found is not None:
                return found
        time.sleep(0.5)
    pytest.fail(f"{what}: not in {seconds}s\n{stack.logs()}")


def healthz(url: str) -> dict[str, Any] | None:
    r = httpx.get(f"{url}/healthz", timeout=5)
    body: dict[str, Any] = r.json() if r.status_code == 200 else {}
    return body if body.get("status") == "ok" else None


def test_compose_stack_serves_on_both_replicas_and_its_worker_runs_a_task(stack: Stack) -> None:
    for url in stack.web:
        body = wait_for(f"{url}/healthz ok", lambda url=url: healthz(url), stack)  # type: ignore[misc]
        assert body["workers"] == {"claiming": 1, "engine_unreachable": 0, "lost": 0}, body

    made = stack.compose(
        "exec", "-T", "web-1", "forgehand", "tokens", "create", "--user", "root", "--name", "smoke",
        "--scope", "repo:write", "--scope", "tasks:write",
    )  # fmt: skip
    token = made.stdout.strip().splitlines()[-1]
    stack.compose("exec", "-T", "web-1", "forgehand", "bots", "create", "smoke-agent", "--owner", "root")
    one, two = (httpx.Client(base_url=u, headers={"Authorization": f"Bearer {token}"}, timeout=30) for u in stack.web)
    with one, two:
        r = one.post("/api/v1/user/repos", json={"name": "demo", "auto_init": True})
        assert r.status_code == 201, r.text
        r = two.put("/api/v1/repos/root/demo/collaborators/smoke-agent", json={"role": "write"})
        assert r.status_code == 200, r.text
        r = two.post(
            "/api/v1/repos/root/demo/tasks",
            json={"goal": "Add a changelog", "agent": "smoke-agent", "runtime": "command",
                  "command": "echo 'made in compose' > CHANGELOG.md"},
        )  # fmt: skip
        assert r.status_code == 201, r.text

        def reviewed() -> dict[str, Any] | None:
            task: dict[str, Any] = one.get("/api/v1/repos/root/demo/tasks/1").json()
            assert task["state"] not in ("failed", "cancelled"), task
            return task if task["state"] == "awaiting_review" else None

        task = wait_for("task 1 awaiting review", reviewed, stack)
    assert task["error"] == "", task
    runs = task["runs"]
    worker = stack.compose("exec", "-T", "worker", "cat", "/proc/sys/kernel/hostname").stdout.strip()
    assert runs[0]["worker"].startswith(f"{worker}:"), runs  # the compose worker (its container's host name)

    clone = stack.data_dir.parent / "clone"
    url = stack.web[0].replace("http://", f"http://root:{token}@")
    done = subprocess.run(
        ["git", "clone", "-q", "--branch", task["branch"], f"{url}/root/demo.git", str(clone)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert (clone / "CHANGELOG.md").read_text() == "made in compose\n"
