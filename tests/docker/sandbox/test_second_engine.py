"""A second Docker engine on this machine (tests/support/second_engine.py) stands in for a second
Docker host: a sandbox of `SandboxEngine(base_url=...)` runs there and only there, next to one on
the first engine; it reaches a 127.0.0.1 service of the host the way sandboxes do (network none,
the egress relay to a Unix socket of the run's channel); and a task runs end to end on a worker
whose engine is the second one."""

import asyncio
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import docker
import docker.errors
import httpx
import msgspec
import pytest

from egress import SOCKET_NAME
from forge.core.settings import Settings, prepare_data_dir
from forge.db.engine import Database
from forge.db.events import EventBus
from forge.git import RepoStore
from sandbox import EGRESS_PROXY_PORT, Relay, SandboxEngine
from sandbox.spec import LABEL_INSTANCE
from tasks.core.live import LiveHub
from tasks.core.policy import AllowAll
from tasks.run.egress import proxy_env
from tasks.run.warm import LABEL_WORKER
from tasks.run.worker import TaskWorker
from tests.docker.conftest import INSTANCE, SpecFactory
from tests.support.egress import origin_server, running_proxy
from tests.support.second_engine import start_second_engine
from tests.support.tasks import containers_of, seed, serve, start, task_settings, tree_files, wait_state
from tests.support.waiting import until


@pytest.fixture(scope="session")
def second_host(sandbox_image: str) -> str:
    """The second engine's DOCKER_HOST, started (or found running) with the sandbox image on it."""
    ready = start_second_engine((sandbox_image,))
    print(ready.describe(), file=sys.stderr)
    return ready.docker_host


@pytest.fixture(scope="session")
def second_client(second_host: str) -> Iterator[docker.DockerClient]:
    client = docker.DockerClient(base_url=second_host, timeout=30)
    yield client
    # Whatever a failing test left there.
    for c in client.containers.list(all=True, filters={"label": f"{LABEL_INSTANCE}={INSTANCE}"}):
        c.remove(force=True)
    client.close()


@pytest.fixture
async def second_engine(second_host: str) -> AsyncIterator[SandboxEngine]:
    async with SandboxEngine(base_url=second_host) as eng:
        yield eng


def ids(client: docker.DockerClient, label: str) -> set[str]:
    return {c.id for c in client.containers.list(all=True, filters={"label": label})}


async def test_a_sandbox_runs_on_the_second_engine_only(
    engine: SandboxEngine,
    second_engine: SandboxEngine,
    make_spec: SpecFactory,
    docker_client: docker.DockerClient,
    second_client: docker.DockerClient,
) -> None:
    label = f"{LABEL_INSTANCE}={INSTANCE}"
    async with await second_engine.start(make_spec()) as there, await engine.start(make_spec()) as here:
        r2, r1 = await asyncio.gather(
            there.exec(["sh", "-c", "echo on $(hostname) as $(id -u); ls /sys/class/net"]),
            here.exec(["sh", "-c", "echo on $(hostname) as $(id -u); ls /sys/class/net"]),
        )
        assert r2.exit_code == 0 and r2.stdout == b"on sandbox as 1000\nlo\n", r2
        assert r1.exit_code == 0 and r1.stdout == r2.stdout, r1
        on_second, on_first = ids(second_client, label), ids(docker_client, label)
        assert there.id in on_second and there.id not in on_first
        assert here.id in on_first and here.id not in on_second
        with pytest.raises(docker.errors.NotFound):
            docker_client.containers.get(there.id)
        assert second_client.containers.get(there.id).status == "running"
    assert there.id not in ids(second_client, label)  # removed from the engine it ran on


async def test_the_second_engines_sandbox_reaches_a_host_loopback_service_through_its_channel(
    second_engine: SandboxEngine, make_spec: SpecFactory, channel_dir: Path
) -> None:
    spec = make_spec(channel_dir=channel_dir, relays=(Relay(EGRESS_PROXY_PORT, SOCKET_NAME),), env=proxy_env())
    with origin_server({"/hello": b"from the host's loopback\n"}) as origin:
        async with (
            running_proxy(channel_dir / SOCKET_NAME, [f"127.0.0.1:{origin.port}"], allowed_hosts="127.0.0.1") as rec,
            await second_engine.start(spec) as sb,
        ):
            curl = await sb.exec(["curl", "-sS", f"http://127.0.0.1:{origin.port}/hello"])
            direct = await sb.exec(["curl", "-sS", "--noproxy", "*", f"http://127.0.0.1:{origin.port}/hello"])
    assert curl.exit_code == 0 and curl.stdout == b"from the host's loopback\n", curl.stderr
    assert direct.exit_code != 0  # the container's own loopback: network none, nothing but the relay
    assert [p for _, p, _ in origin.requests] == ["/hello"]
    assert [(a.method, a.port) for a in rec.allowed] == [("GET", origin.port)]


@pytest.fixture
def worker_env(settings: Settings, sandbox_image: str) -> Iterator[tuple[Settings, str, Path]]:
    s = task_settings(settings, run_worker=False)  # the served app runs no worker: the test's does
    token, repo_path = asyncio.run(seed(s))
    yield s, token, repo_path


@asynccontextmanager
async def worker_on(second_host: str, settings: Settings) -> AsyncIterator[TaskWorker]:
    """A started task worker of `settings` (its database, its data directory) whose sandboxes run
    on the second engine; closed with everything it opened."""
    db = Database(settings.effective_database_url)
    store = RepoStore(settings.data_dir / "repos")
    engine = SandboxEngine(base_url=second_host)
    worker = TaskWorker(db, settings, store, EventBus(), LiveHub(), AllowAll(), engine=engine)
    try:
        await worker.start()
        yield worker
    finally:
        await worker.close()
        await engine.close()
        await store.close()
        await db.dispose()


def created_on(client: docker.DockerClient, instance: str, since: int) -> list[dict[str, Any]]:
    """The labels of the containers of `instance` that `client`'s engine created since `since`."""
    events = client.events(
        since=since,
        until=int(time.time()) + 1,
        filters={"type": "container", "event": "create", "label": f"{LABEL_INSTANCE}={instance}"},
        decode=True,
    )
    return [dict(e["Actor"]["Attributes"]) for e in events]


async def test_a_task_runs_end_to_end_on_a_worker_of_the_second_engine(
    worker_env: tuple[Settings, str, Path],
    second_host: str,
    second_client: docker.DockerClient,
    docker_client: docker.DockerClient,
) -> None:
    settings, token, repo_path = worker_env
    label = f"{LABEL_INSTANCE}={settings.instance_id}"
    since = int(time.time()) - 1
    # The run waits for `go` (written below, through the second engine's API) so that the test sees
    # its container while it runs, wherever that is.
    script = "echo started; while [ ! -f go ]; do sleep 0.1; done; rm go; hostname > where.txt; echo done"
    async with worker_on(second_host, settings) as worker:
        for url in serve(settings):
            async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60) as c:
                await start(c, script)

                def running() -> list[Any]:
                    return list(second_client.containers.list(filters={"label": label}))

                [box] = await until(lambda: asyncio.to_thread(running), timeout=120, what="the run's container")
                assert box.labels[LABEL_WORKER] == worker.id
                assert not containers_of(settings)  # nothing of this instance on the first engine
                with pytest.raises(docker.errors.NotFound):
                    docker_client.containers.get(box.id)
                touched = await asyncio.to_thread(box.exec_run, ["touch", "/workspace/go"], user="1000:1000")
                assert touched.exit_code == 0, touched.output
                done = await wait_state(c, 1, "awaiting_review", "failed")
    assert done["state"] == "awaiting_review", done
    [run] = done["runs"]
    assert run["state"] == "succeeded" and run["exit_code"] == 0 and run["worker"] == worker.id
    files = tree_files(repo_path, done["head_sha"])
    assert files["where.txt"] == (0o100644, b"sandbox\n") and "go" not in files
    # The engine's own record: the second one created the run's container (and it is gone now);
    # the first created nothing of this instance.
    created = await asyncio.to_thread(created_on, second_client, settings.instance_id, since)
    assert [a.get(LABEL_WORKER) for a in created] == [worker.id]
    assert await asyncio.to_thread(created_on, docker_client, settings.instance_id, since) == []
    assert not await asyncio.to_thread(lambda: second_client.containers.list(all=True, filters={"label": label}))


async def test_a_worker_on_a_host_without_the_shared_storage_fails_its_run_naming_it(
    worker_env: tuple[Settings, str, Path], second_host: str, tmp_path: Path
) -> None:
    """A worker whose host has its own data directory, not the shared one (docs/operator.md, "Past
    one machine"): the run it claims fails at its checkout, with an error that names the missing
    repository; nothing runs."""
    settings, token, _repo_path = worker_env
    elsewhere = prepare_data_dir(msgspec.structs.replace(settings, data_dir=tmp_path / "other-host"))
    async with worker_on(second_host, elsewhere) as worker:
        for url in serve(settings):
            async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60) as c:
                await start(c, "echo ran > ran.txt")
                done = await wait_state(c, 1, "awaiting_review", "failed")
    assert done["state"] == "failed", done
    [run] = done["runs"]
    assert run["worker"] == worker.id and run["exit_code"] is None, run
    assert run["failure_reason"] == "workspace" and done["failure_reason"] == "workspace", run
    assert "the repository ana/demo is not in this worker's repositories' directory" in run["error"], run
    assert "mount the shared data directory" in run["error"], run
