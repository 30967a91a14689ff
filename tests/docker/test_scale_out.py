"""The multi-process suite: forgehand as a team past one machine runs it, on PostgreSQL.

Two `forgehand serve` replicas without workers (the clients talk to both) and two `forgehand
worker` processes, each on its own Docker engine (the second a second `dockerd` with its own
socket, data root and bridge: tests/support/second_engine.py), sharing the data directory (the
repositories' shared storage, docs/operator.md). The replicas start together on an empty
database and migrate it once between them.

- 30 tasks started across both replicas each run exactly once, on one worker or the other, their
  numbers gap-free;
- an SSE client on replica A follows, gap-free, a task started on replica B and run by a worker:
  the lag from each event's commit to its arrival is reported;
- a worker SIGKILLed mid-run: the other one removes its container on the dead worker's engine,
  snapshots the workspace as the work-in-progress commit and ends the run `interrupted`, within
  the lease;
- a worker whose engine does not answer claims nothing and says so in `/healthz`;
- a replica SIGKILLed while requests are under way loses none it answered.

Slow by nature (about a minute): four processes, 30 sandboxes on two engines."""

import asyncio
import json
import signal
import statistics
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import docker
import httpx
import pytest
from standardwebhooks.webhooks import Webhook

from tests.support.cluster import Cluster, post_task, running_cluster, start_worker, stop, task_body
from tests.support.second_engine import ensure_second_engine
from tests.support.tasks import all_events, wait_state, wait_task
from tests.support.waiting import until
from tests.support.webhooks import receiver

pytestmark = [pytest.mark.xdist_group("scale_out")]

LEASE = 8.0
TASKS = "/api/v1/repos/ana/demo/tasks"
LABEL_WORKER = "org.forgehand.worker"
RESTING = ("awaiting_review", "failed", "succeeded", "merged", "cancelled", "stopped")


@pytest.fixture(scope="module")
def engines(sandbox_image: str) -> tuple[str, str]:
    """The two engines: this host's and the second dockerd, both holding the sandbox image."""
    return "unix:///var/run/docker.sock", ensure_second_engine(images=(sandbox_image,))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, engines: tuple[str, str]) -> Iterator[Cluster]:
    with running_cluster(tmp_path_factory.mktemp("scale-out"), lease=LEASE, workers=engines) as made:
        yield made


async def live_workers(c: httpx.AsyncClient) -> list[dict[str, Any]]:
    """The workers the admin API lists as live (`c` an admin's client)."""
    listed: list[dict[str, Any]] = (await c.get("/api/v1/admin/workers")).json()
    return [w for w in listed if w["state"] in ("claiming", "engine_unreachable")]


async def test_replicas_migrate_once_and_both_workers_claim(cluster: Cluster) -> None:
    logs = "".join((cluster.logs / f"serve-{i}.log").read_text(errors="replace") for i in (0, 1))
    assert "Traceback" not in logs, logs[-3000:]
    async with cluster.client(1) as c:
        await until(lambda: _count_claiming(c), timeout=60, what="/healthz on replica B to count both workers")
    async with cluster.admin(0) as admin:
        assert len([w for w in await live_workers(admin) if w["state"] == "claiming"]) >= 2


async def _count_claiming(c: httpx.AsyncClient) -> bool:
    return bool((await c.get("/healthz")).json()["workers"]["claiming"] >= 2)


async def test_thirty_tasks_across_replicas_run_exactly_once(cluster: Cluster) -> None:
    async with cluster.client(0) as a, cluster.client(1) as b:
        bodies = await asyncio.gather(
            *(post_task(a if i % 2 else b, task_body(f"g{i}", f"echo {i} > out.txt")) for i in range(30))
        )
        assert [r.status_code for r in bodies] == [201] * 30, [r.text for r in bodies if r.status_code != 201]
        numbers = sorted(r.json()["number"] for r in bodies)
        first = numbers[0]
        assert numbers == list(range(first, first + 30))  # gap-free, each given once
        done = [
            await wait_task(a, n, lambda t: t["state"] in RESTING, what=f"task {n} to finish", timeout=240)
            for n in numbers
        ]
    failed = [
        (t["number"], t["runs"][-1]["failure_reason"], t["runs"][-1]["error"])
        for t in done
        if t["state"] != "awaiting_review"
    ]
    assert not failed, failed
    assert all(len(t["runs"]) == 1 and t["runs"][0]["state"] == "succeeded" for t in done)
    by_worker: dict[str, int] = {}
    for t in done:
        by_worker[t["runs"][0]["worker"]] = by_worker.get(t["runs"][0]["worker"], 0) + 1
    assert len(by_worker) == 2, by_worker  # both workers, on their two engines, took runs
    async with cluster.client(1) as b:
        for t in done:
            claims = [e for e in await all_events(b, t["number"]) if e["payload"].get("phase") == "claimed"]
            assert len(claims) == 1, (t["number"], claims)  # run exactly once
    print(f"\n30 tasks: runs per worker {sorted(by_worker.values())}")


async def _follow(c: httpx.AsyncClient, number: int) -> list[tuple[int, float]]:
    """(seq, arrival time) of every event of task `number` over SSE, until the stream ends."""
    got: list[tuple[int, float]] = []
    async with c.stream("GET", f"{TASKS}/{number}/events", timeout=120) as r:
        assert r.status_code == 200
        event = ""
        async for line in r.aiter_lines():
            if line.startswith("id: "):
                got.append((int(line[4:]), time.time()))
            elif line.startswith("event: "):
                event = line[7:]
            elif line == "" and event == "end":
                return got
    return got


async def test_sse_on_one_replica_sees_a_workers_events_of_the_otherstask_body(cluster: Cluster) -> None:
    async with cluster.client(0) as a, cluster.client(1) as b:
        task = (
            await b.post(
                TASKS,
                json={
                    "goal": "stream",
                    "agent": "fixer",
                    "command": "for i in $(seq 1 20); do echo line $i; sleep 0.05; done",
                },
            )
        ).json()
        arrivals = await _follow(a, task["number"])
        events = await all_events(b, task["number"])
    seqs = [s for s, _ in arrivals]
    assert seqs == list(range(1, len(seqs) + 1)) and seqs == [e["seq"] for e in events]  # gap-free, all
    assert sum(e["kind"] == "stdout" for e in events) >= 1
    stamps = {e["seq"]: datetime.fromisoformat(e["at"]).timestamp() for e in events}
    lags = sorted(max(0.0, at - stamps[s]) for s, at in arrivals[1:])  # the first is the replay
    p95 = lags[int(0.95 * (len(lags) - 1))] if lags else 0.0
    print(
        f"\nSSE across replicas: {len(seqs)} events, "
        f"lag median {statistics.median(lags) * 1000:.0f} ms, p95 {p95 * 1000:.0f} ms"
    )


def _containers(docker_host: str, worker_id: str) -> list[Any]:
    client = docker.DockerClient(base_url=docker_host, timeout=30)
    try:
        return list(client.containers.list(all=True, filters={"label": f"{LABEL_WORKER}={worker_id}"}))
    finally:
        client.close()


async def test_a_worker_killed_mid_run_is_taken_over_within_the_lease(cluster: Cluster) -> None:
    async with cluster.client(0) as a:
        task = (
            await a.post(
                TASKS, json={"goal": "wip", "agent": "fixer", "command": "echo wip > wip.txt; echo started; sleep 300"}
            )
        ).json()
        number = task["number"]
        running = await wait_state(a, number, "running")
        await until(lambda: _printed(a, number, "started"), timeout=60, what="the run to print 'started'")
        owner = (await a.get(f"{TASKS}/{number}")).json()["runs"][0]["worker"]
        assert owner and running
        pid = int(owner.split(":")[1])
        [(host, proc)] = [(h, p) for h, p in cluster.workers.items() if p.pid == pid]
        assert _containers(host, owner), "the run's sandbox is on its worker's engine"
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        killed = time.monotonic()
        body = await wait_task(
            a,
            number,
            lambda t: t["state"] == "failed",
            what="the killed worker's run to be taken over",
            timeout=4 * LEASE,
        )
        took = time.monotonic() - killed
    assert body["failure_reason"] == "interrupted" and body["runs"][0]["worker"] == owner, body
    assert body["head_is_wip"] is True  # the workspace's work is the work-in-progress commit
    assert not _containers(host, owner), "the dead worker's sandbox was removed on its own engine"
    print(f"\nworker SIGKILLed: run taken over in {took:.1f} s (lease {LEASE:.0f} s)")
    assert took <= 2 * LEASE
    del cluster.workers[host]
    start_worker(cluster, host, "worker-restarted")  # its engine serves again for the next tests


async def _printed(c: httpx.AsyncClient, number: int, text: str) -> bool:
    return any(e["kind"] == "stdout" and text in e["payload"]["text"] for e in await all_events(c, number))


async def test_a_frozen_worker_loses_its_lease_and_once_thawed_writes_nothing(cluster: Cluster) -> None:
    """A worker whose process stops answering (SIGSTOP: a hung process, a host gone silent, a cut
    network; its pid is alive) keeps no lease: past it, the other worker takes its run over. Thawed,
    it finds the run taken, stops it and settles nothing (the branch keeps the taker's snapshot)."""
    async with cluster.client(1) as b:
        number = (await b.post(TASKS, json=task_body("frozen", "echo wip > wip.txt; echo started; sleep 300"))).json()[
            "number"
        ]
        await wait_state(b, number, "running")
        await until(lambda: _printed(b, number, "started"), timeout=60, what="the run to print 'started'")
        owner = (await b.get(f"{TASKS}/{number}")).json()["runs"][0]["worker"]
        [(host, proc)] = [(h, p) for h, p in cluster.workers.items() if p.pid == int(owner.split(":")[1])]
        proc.send_signal(signal.SIGSTOP)
        frozen = time.monotonic()
        try:
            taken = await wait_task(
                b,
                number,
                lambda t: t["state"] == "failed",
                what="the frozen worker's run taken over",
                timeout=4 * LEASE,
            )
            took = time.monotonic() - frozen
        finally:
            proc.send_signal(signal.SIGCONT)
        assert taken["failure_reason"] == "interrupted" and taken["head_is_wip"] is True, taken
        await until(lambda: _said(cluster, owner, "lease was taken over"), timeout=30, what="the thawed worker to see")
        after = (await b.get(f"{TASKS}/{number}")).json()
    assert after["state"] == "failed" and after["head_sha"] == taken["head_sha"] and len(after["runs"]) == 1, after
    assert not _containers(host, owner)
    print(f"\nworker frozen: lease lapsed and run taken over in {took:.1f} s (lease {LEASE:.0f} s)")
    assert took <= 2 * LEASE


def _said(cluster: Cluster, worker: str, text: str) -> bool:
    """Whether worker `worker` logged a line holding `text`."""
    for log in cluster.logs.glob("worker-*.log"):
        if any(text in line and worker in line for line in log.read_text(errors="replace").splitlines()):
            return True
    return False


async def test_a_worker_without_its_engine_claims_nothing_and_says_so(cluster: Cluster) -> None:
    proc = start_worker(cluster, "unix:///nonexistent/forgehand/docker.sock", "worker-no-engine")
    try:
        async with cluster.admin(1) as b:

            async def unreachable() -> list[dict[str, Any]]:
                return [
                    w
                    for w in await live_workers(b)
                    if w["state"] == "engine_unreachable" and f":{proc.pid}:" in w["id"]
                ]

            [shown] = await until(unreachable, timeout=60, what="the admin API to show the worker without an engine")
            assert shown["running"] == 0 and "does not answer" in shown["engine_error"]
            health = (await b.get("/healthz")).json()
            assert health["status"] == "degraded" and health["workers"]["engine_unreachable"] == 1
    finally:
        stop([proc])
        cluster.workers.pop("unix:///nonexistent/forgehand/docker.sock", None)


async def test_both_workers_deliverers_deliver_each_event_with_one_id(cluster: Cluster) -> None:
    """Each `forgehand worker` runs a deliverer on the one outbox: every notification is delivered
    at least once, and every delivery of one event carries the same `webhook-id`."""
    with receiver() as consumer:
        async with cluster.admin(0) as admin:
            hook = {"url": consumer.url, "kind": "notify", "events": ["task.created", "run.finished"]}
            made = await admin.post("/api/v1/repos/ana/demo/hooks", json=hook)
            assert made.status_code == 201, made.text
        async with cluster.client(0) as a, cluster.client(1) as b:
            answers = await asyncio.gather(
                *(post_task(a if i % 2 else b, task_body(f"h{i}", "true")) for i in range(10))
            )
            numbers = {r.json()["number"] for r in answers}

            def delivered() -> bool:
                bodies = [json.loads(x.body) for x in consumer.seen]
                found = {(body["type"], body["meta"]["task"]["number"]) for body in bodies}
                return all((kind, n) in found for n in numbers for kind in ("task.created", "run.finished"))

            await until(delivered, timeout=180, what="every task's task.created and run.finished delivered")
        by_id: dict[str, set[bytes]] = {}
        for seen in consumer.seen:
            Webhook(made.json()["secret"]).verify(seen.body, seen.headers)
            by_id.setdefault(seen.headers["webhook-id"], set()).add(seen.body)
    assert all(len(bodies) == 1 for bodies in by_id.values())  # a redelivery is the same event, same id
    print(f"\n{len(consumer.seen)} deliveries of {len(by_id)} events by the workers' deliverers")


async def test_a_replica_killed_mid_request_loses_nothing_it_answered(cluster: Cluster) -> None:
    victim = cluster.replica_procs[1]
    async with cluster.client(1) as b, cluster.client(0) as a:
        before = {t["number"] for t in (await a.get(TASKS)).json()}

        async def post(i: int) -> int | None:
            try:
                r = await b.post(TASKS, json={"goal": f"k{i}", "agent": "fixer", "command": "true"})
            except httpx.TransportError:
                return None
            return int(r.json()["number"]) if r.status_code == 201 else None

        posts = [asyncio.create_task(post(i)) for i in range(12)]
        await asyncio.wait(posts, return_when=asyncio.FIRST_COMPLETED)
        victim.send_signal(signal.SIGKILL)
        answered = {n for n in await asyncio.gather(*posts) if n is not None}
        assert answered, "at least one start was answered before the kill"
        after = {t["number"] for t in (await a.get(TASKS)).json()}
    new = after - before
    assert answered <= new  # every answered start is there
    assert sorted(new) == list(range(min(new), min(new) + len(new)))  # and the numbers stay gap-free
