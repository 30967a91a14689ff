"""A forgehand cluster on one machine, as the multi-process suite and the scale-out bench run it:
`forgehand serve` replicas without workers, and `forgehand worker` processes each on the Docker
engine its DOCKER_HOST names, all on one PostgreSQL database and one data directory (the shared
storage of docs/operator.md, "Past one machine"). Each process logs to its own file."""

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from forge.accounts import accounts, tokens
from forge.core.settings import Settings, load_settings, prepare_data_dir
from forge.db.audit import Actor
from forge.db.engine import Database
from sandbox import quota_mounts, remove_workspace
from tests.support import databases
from tests.support.ports import free_port
from tests.support.tasks import seed
from tests.support.waiting import until_sync

FORGEHAND = str(Path(sys.executable).with_name("forgehand"))
TASKS = "/api/v1/repos/ana/demo/tasks"
LABEL_WORKER = "org.forgehand.worker"
RESTING = ("awaiting_review", "failed", "succeeded", "merged", "cancelled", "stopped")


@dataclass
class Cluster:
    settings: Settings
    token: str
    replicas: list[str]
    replica_procs: list[subprocess.Popen[bytes]]
    workers: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)  # DOCKER_HOST -> process
    logs: Path = Path()
    lease: float = 30.0
    admin_token: str = ""  # ana's, an instance admin's: the admin API and webhooks

    def admin(self, replica: int) -> httpx.AsyncClient:
        headers = {"Authorization": f"Bearer {self.admin_token}"}
        return httpx.AsyncClient(base_url=self.replicas[replica], headers=headers, timeout=30)

    def client(self, replica: int) -> httpx.AsyncClient:
        headers = {"Authorization": f"Bearer {self.token}"}
        return httpx.AsyncClient(base_url=self.replicas[replica], headers=headers, timeout=30)


def _env(settings: Settings, lease: float, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FORGEHAND_", "DOCKER_HOST"))}
    env.update(
        {
            "FORGEHAND_DATA_DIR": str(settings.data_dir),
            "FORGEHAND_DATABASE_URL": settings.effective_database_url,
            "FORGEHAND_SEED_DEMO": "false",
            "FORGEHAND_LOG_LEVEL": "warning",
            "FORGEHAND_RUN_WORKER": "false",
            "FORGEHAND_WORKER_LEASE_SECONDS": str(lease),
            "FORGEHAND_TASK_CONCURRENCY": "3",
            "FORGEHAND_TASK_REPO_CONCURRENCY": "8",
            "FORGEHAND_WEBHOOKS_ALLOWED_HOSTS": "127.0.0.1",  # the suite's webhook receivers
        }
        | extra
    )
    return env


def _spawn(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen([FORGEHAND, *args], env=env, stdout=out, stderr=subprocess.STDOUT)


def _healthy(url: str, proc: subprocess.Popen[bytes]) -> bool:
    assert proc.poll() is None, f"the process serving {url} exited"
    return httpx.get(f"{url}/healthz", timeout=2).status_code == 200


def start_worker(cluster: Cluster, docker_host: str, name: str, *, capacity: int = 0) -> subprocess.Popen[bytes]:
    """A `forgehand worker` on the engine `docker_host`; `capacity`: its runs at once (0: the
    cluster's FORGEHAND_TASK_CONCURRENCY, 3)."""
    env = _env(cluster.settings, cluster.lease, FORGEHAND_BASE_URL=cluster.replicas[0]) | {"DOCKER_HOST": docker_host}
    args = ["worker", *(["--capacity", str(capacity)] if capacity else [])]
    proc = _spawn(args, env, cluster.logs / f"{name}.log")
    cluster.workers[docker_host] = proc
    return proc


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def postgres_admin_url() -> str:
    """The maintenance database the suite makes its databases with (FORGEHAND_TEST_DATABASE_URL)."""
    admin_url = os.environ.get("FORGEHAND_TEST_DATABASE_URL", "")
    if not admin_url.startswith("postgresql"):
        pytest.fail(
            "the multi-process suite runs on PostgreSQL: set FORGEHAND_TEST_DATABASE_URL "
            "(deploy/scripts/provision-test-host --postgres prints the port; `make test` does it)",
            pytrace=False,
        )
    return admin_url


@contextmanager
def running_cluster(tmp: Path, *, lease: float, workers: tuple[str, ...] = ()) -> Iterator[Cluster]:
    """Two replicas started together on a new, empty database (one migrates, the other waits for
    it), the demo world seeded (ana/demo, a token of ana's), and a worker on each of `workers`
    (DOCKER_HOST values); every process stopped on leaving."""
    url = asyncio.run(databases.postgres_empty(postgres_admin_url()))
    settings = prepare_data_dir(load_settings(environ={}, data_dir=tmp / "data", database_url=url, seed_demo=False))
    ports = [free_port(), free_port()]
    replicas = [f"http://127.0.0.1:{p}" for p in ports]
    procs = [
        _spawn(
            ["serve"],
            _env(settings, lease, FORGEHAND_PORT=str(p), FORGEHAND_BASE_URL=replicas[0]),
            tmp / f"serve-{i}.log",
        )
        for i, p in enumerate(ports)
    ]
    made = Cluster(settings=settings, token="", replicas=replicas, replica_procs=procs, logs=tmp, lease=lease)
    try:
        for url_, proc in zip(replicas, procs, strict=True):
            until_sync(
                lambda u=url_, p=proc: _healthy(u, p),  # type: ignore[misc]
                timeout=120,
                what=f"{url_} to answer /healthz",
                ignoring=(httpx.TransportError,),
            )
        made.token, _ = asyncio.run(seed(settings))
        made.admin_token = asyncio.run(_admin_token(settings))
        for i, host in enumerate(workers):
            start_worker(made, host, f"worker-{i}")
        yield made
    finally:
        stop([*made.workers.values(), *procs])
        _unmount_leftovers(settings.data_dir / "workspaces")


def _unmount_leftovers(root: Path) -> None:
    """Workspaces a stopped worker left mounted (runs it was stopped in the middle of; a worker's
    next start sweeps them, and this cluster has none): removed, so that no loop device leaks."""
    for mounted in quota_mounts(root):
        remove_workspace(mounted)


async def _admin_token(settings: Settings) -> str:
    """ana made an instance admin, with a token for the admin API and webhooks."""
    db = Database(settings.effective_database_url)
    try:
        async with db.session(write=True) as s:
            ana = await accounts.require_by_login(s, "ana")
            ana.is_admin = True
            made = await tokens.create(s, Actor.system("test"), ana, "admin", ["admin", "webhooks:admin"], None)
            return made.token
    finally:
        await db.dispose()


def task_body(goal: str, command: str) -> dict[str, Any]:
    return {"goal": goal, "agent": "fixer", "command": command}


async def post_task(client: httpx.AsyncClient, body: dict[str, Any]) -> httpx.Response:
    """Start a task as a client should: a `503 database_busy` (nothing was written; the write
    path had no room in time, as under a burst on a loaded machine) is tried again after its
    `Retry-After`, at most five times."""
    for _ in range(5):
        r = await client.post("/api/v1/repos/ana/demo/tasks", json=body)
        if r.status_code != 503:
            return r
        await asyncio.sleep(float(r.headers.get("retry-after", "1")))
    return r
