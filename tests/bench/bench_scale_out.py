"""Scale-out, measured in one run on PostgreSQL (tests/support/cluster.py: two `forgehand serve`
replicas without workers, workers on two Docker engines, one data directory):

- throughput: 50 `command` tasks running `true`, started across both replicas, from the first
  start to the last task at rest, with one worker, then with two workers on two engines. Goal: two
  workers take <= 0.6x the time of one (close to 0.5x). The two engines are two hosts in a
  deployment; here they share one 2-CPU machine with PostgreSQL, the replicas and this client, so
  the batches are run three ways, each printed:
  - as the suite runs them (capacity 3 each): one worker alone keeps both CPUs busy, so a second
    worker on the same CPUs cannot finish sooner. 0.98x-1.05x (9.4-9.8 s);
  - each engine (its dockerd and containerd, hence its shims) and its worker pinned to a CPU of
    its own (`taskset`). PostgreSQL, the replicas and this client stay on both CPUs: with one
    worker they have the other CPU to themselves, with two they take theirs from the hosts' CPUs.
    0.63x-0.71x (one worker 13.4-15.0 s, two 8.8-9.9 s);
  - each engine and its worker a host with a CPU budget of its own (HOST_CPUS, a cgroup quota:
    tests/support/cpu_budget.py), the rest of the machine left to the shared services in both
    batches, as a third host would be. This is the set-up the goal speaks of, and its ratio is
    the one asserted: 0.52x-0.55x (one worker 19.4-22.7 s, two 10.6-12.3 s). Why 0.6 CPU: per
    task a host spends about 0.27 s of CPU and the shared services about 0.065 s (below), so two
    hosts of 0.6 CPU (about 4.5 tasks a second) leave them 0.8 CPU where they need about 0.3,
    and the containers' own processes (outside the budgets) about 0.15. With hosts of 0.75 CPU
    the shared services had 0.5 CPU, too little once a sandbox's start cost half as much: 0.65x
    (it was 0.55x before). Above 0.5x is what the shared path costs when two hosts feed it at
    once (the claims, the task locks, the database): a worker spends 0.076 s a task alone and
    0.09 s beside another (0.10 s while a claim locked every queued run, not only those it had
    room for);
- an event from a worker to an SSE client on a replica: the lag from the event's timestamp (its
  writer's) to its arrival, for a task printing 200 lines started on the other replica. Goal:
  p95 < 100 ms (printed: wall clock on a shared machine);
- a lapsed lease: a worker frozen (SIGSTOP) mid-run, until the other worker took its run over.
  Goal: within 2x the lease.

Where one task's CPU goes, measured over a batch (per process, /proc): on its host the worker
0.077 s, dockerd and containerd 0.06 s, the containerd shims 0.014 s, and the processes that come
and go (runc, docker-init, the exec wrapper's shells, mkfs.ext4, mount) about 0.12 s; shared, the
replicas 0.036 s, PostgreSQL 0.024 s and this client 0.005 s. Before sandboxes were created
without Docker's networking (sandbox.SandboxSpec.hosts_file), dockerd re-executed itself twice
per container and a task cost its host about 0.37 s."""

import asyncio
import contextlib
import os
import signal
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import msgspec

from sandbox import DEFAULT_IMAGE, SandboxEngine
from tests.support.cluster import Cluster, post_task, running_cluster, start_worker, stop, task_body
from tests.support.cpu_budget import CpuBudget, cpu_budget
from tests.support.second_engine import ensure_second_engine
from tests.support.sse_lag import sse_frames
from tests.support.tasks import all_events, wait_state, wait_task
from tests.support.waiting import until

TASKS = "/api/v1/repos/ana/demo/tasks"
LOCAL = "unix:///var/run/docker.sock"
SECOND_PIDFILE = "/run/forgehand-dockerd2/docker.pid"
LEASE = 6.0
BATCH = 50
LINES = 200
HOST_CPUS = 0.6  # a worker host's CPU budget in the set-up whose ratio is asserted (see above)


async def ensure_images() -> str:
    async with SandboxEngine() as engine:
        await engine.ensure_image(DEFAULT_IMAGE)
    return ensure_second_engine(images=(DEFAULT_IMAGE,))


async def batch_seconds(cluster: Cluster, label: str) -> float:
    """BATCH tasks of `true` across both replicas: seconds from the first start to the last rest."""
    async with cluster.client(0) as a, cluster.client(1) as b:
        t0 = time.monotonic()
        answers = await asyncio.gather(
            *(post_task(a if i % 2 else b, task_body(f"{label}{i}", "true")) for i in range(BATCH))
        )
        assert all(r.status_code == 201 for r in answers), [r.text for r in answers if r.status_code != 201]
        numbers = [r.json()["number"] for r in answers]

        async def all_rest() -> bool:
            # One task still going is enough to know (the batch's are the only tasks then going):
            # listing every task five times a second would cost the replicas CPU that the batch
            # needs, and that would be measured too.
            for going in ("queued", "running"):
                if (await a.get(TASKS, params={"state": going, "per_page": 1})).json():
                    return False
            return True

        await until(all_rest, timeout=900, interval=0.2, what=f"the {label} batch to finish")
        took = time.monotonic() - t0
        failed = [
            (t["number"], t["failure_reason"], t["error"])
            for t in (await a.get(TASKS)).json()
            if t["number"] in numbers and t["state"] == "failed"
        ]
    assert not failed, f"{label}: tasks failed: {failed}"
    return took


async def event_lags(cluster: Cluster) -> list[float]:
    """Lags of the transcript events of a task started on replica B and run by a worker, followed
    live on replica A (this process only reads: the servers and workers are processes of their own)."""
    lags: list[float] = []
    async with cluster.client(1) as b, cluster.client(0) as a:
        command = f"for i in $(seq 1 {LINES}); do echo line $i; sleep 0.01; done"
        number = (await b.post(TASKS, json=task_body("lag", command))).json()["number"]
        headers = {"Accept": "text/event-stream"}
        async with a.stream("GET", f"{TASKS}/{number}/events", headers=headers, timeout=300) as r:
            async for event, data in sse_frames(r):
                if event == "end":
                    break
                if event not in ("state", "message"):
                    at = msgspec.json.decode(data)["at"]
                    lags.append(time.time() - datetime.fromisoformat(at.replace("Z", "+00:00")).timestamp())
        stored = len(await all_events(b, number))
    assert len(lags) == stored, f"{len(lags)} events followed, {stored} stored"
    return lags[1:]  # the first is read at connect time (a replay, not a crossing)


async def lease_takeover_seconds(cluster: Cluster) -> float:
    async with cluster.client(0) as a:
        number = (await a.post(TASKS, json=task_body("frozen", "echo started; sleep 300"))).json()["number"]
        await wait_state(a, number, "running", timeout=120)
        owner = (await a.get(f"{TASKS}/{number}")).json()["runs"][0]["worker"]
        [proc] = [p for p in cluster.workers.values() if p.pid == int(owner.split(":")[1])]
        proc.send_signal(signal.SIGSTOP)
        t0 = time.monotonic()
        try:
            await wait_task(a, number, lambda t: t["state"] == "failed", what="the take-over", timeout=10 * LEASE)
        finally:
            proc.send_signal(signal.SIGCONT)
        return time.monotonic() - t0


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def test_scale_out() -> None:
    # The cluster's set-up runs its own event loops (as the multi-process suite's fixture does):
    # each phase here is one of its own.
    second = asyncio.run(ensure_images())
    with tempfile.TemporaryDirectory() as tmp, running_cluster(Path(tmp), lease=LEASE, workers=(LOCAL,)) as cluster:
        asyncio.run(batch_seconds(cluster, "warm"))  # both replicas and the engine past their first task
        busy = one_then_two(cluster, second, "busy", Shared())
        with pinned_engines(second) as pinned:
            pins = one_then_two(cluster, second, "pin", pinned)
        with host_budgets(second) as budgets:
            hosts = one_then_two(cluster, second, "host", budgets)
        lags = asyncio.run(event_lags(cluster))
        takeover = asyncio.run(lease_takeover_seconds(cluster))
    for (one, two), what in (
        (busy, "all on both CPUs"),
        (pins, "each engine and its worker on a CPU of its own"),
        (hosts, f"each engine and its worker a host of {HOST_CPUS} CPU, the rest to the shared services"),
    ):
        print(
            f"\n{BATCH} tasks of `true` ({what}): one worker {one:.1f} s, "
            f"two workers on two engines {two:.1f} s: {two / one:.2f}x"
        )
    print(
        f"worker -> SSE client on the other replica: {len(lags)} events, lag median "
        f"{statistics.median(lags) * 1000:.0f} ms, p95 {pct(lags, 0.95) * 1000:.0f} ms"
    )
    print(f"lapsed lease taken over in {takeover:.1f} s: {takeover / LEASE:.2f}x the lease ({LEASE:.0f} s)")
    one, two = hosts
    assert two / one <= 0.6, f"two workers took {two / one:.2f}x one worker's time (goal <= 0.6x)"
    assert takeover <= 2 * LEASE


class Shared:
    """Where a batch's worker goes: here, with its engine, on the machine's CPUs as they are."""

    def place(self, pid: int, host: int) -> None:
        pass


def one_then_two(cluster: Cluster, second: str, label: str, placing: Shared) -> tuple[float, float]:
    """A batch on one worker of the local engine (host 0), then on it and one of the second engine
    (host 1), each worker placed with its engine; the workers running before are replaced. Both
    seconds."""
    stop(list(cluster.workers.values()))
    cluster.workers.clear()
    placing.place(start_worker(cluster, LOCAL, f"worker-{label}-local").pid, 0)
    asyncio.run(until(lambda: claiming(cluster, 1), timeout=60, what="the local worker to claim"))
    one = asyncio.run(batch_seconds(cluster, f"{label}-one"))
    placing.place(start_worker(cluster, second, f"worker-{label}-second").pid, 1)
    asyncio.run(until(lambda: claiming(cluster, 2), timeout=60, what="the second worker to claim"))
    return one, asyncio.run(batch_seconds(cluster, f"{label}-two"))


def engine_pids(pidfile: str) -> list[int]:
    """A dockerd (from its pid file) and its containerd, whose shims and containers inherit the CPUs."""
    dockerd = int(Path(pidfile).read_text().strip())
    children = subprocess.run(["pgrep", "-P", str(dockerd)], capture_output=True, text=True, timeout=10).stdout
    return [dockerd, *(int(p) for p in children.split())]


def set_cpus(pids: list[int], cpus: str) -> None:
    for pid in pids:
        subprocess.run(["taskset", "-a", "-p", "-c", cpus, str(pid)], check=True, capture_output=True, timeout=10)


class Pinned(Shared):
    def place(self, pid: int, host: int) -> None:
        set_cpus([pid], str(host))


@contextlib.contextmanager
def pinned_engines(second: str) -> Iterator[Pinned]:
    """Each engine on one CPU of its own (CPU 0: the local engine, CPU 1: the second), standing in
    for two one-CPU hosts; PostgreSQL, the replicas and this client stay on both. Undone after."""
    local, other = engine_pids("/var/run/docker.pid"), engine_pids(SECOND_PIDFILE)
    set_cpus(local, "0")
    set_cpus(other, "1")
    try:
        yield Pinned()
    finally:
        every = f"0-{(os.cpu_count() or 1) - 1}"
        set_cpus(local + other, every)


class Budgeted(Shared):
    def __init__(self, budgets: list[CpuBudget]) -> None:
        self.budgets = budgets

    def place(self, pid: int, host: int) -> None:
        self.budgets[host].add([pid])


@contextlib.contextmanager
def host_budgets(second: str) -> Iterator[Budgeted]:
    """Each engine (its dockerd and containerd, hence its shims and runc) and later its worker in a
    CPU budget of HOST_CPUS of its own (tests/support/cpu_budget.py), standing in for two hosts of
    that size; PostgreSQL, the replicas and this client have the rest of the machine in both
    batches, as a third host. Undone after."""
    with cpu_budget("forgehand-host-0", HOST_CPUS) as local, cpu_budget("forgehand-host-1", HOST_CPUS) as other:
        local.add(engine_pids("/var/run/docker.pid"))
        other.add(engine_pids(SECOND_PIDFILE))
        yield Budgeted([local, other])


async def claiming(cluster: Cluster, count: int) -> bool:
    async with httpx.AsyncClient(timeout=10) as c:
        body: dict[str, Any] = (await c.get(f"{cluster.replicas[0]}/healthz")).json()
    return bool(body["workers"]["claiming"] == count)
