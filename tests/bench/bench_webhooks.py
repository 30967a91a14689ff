"""Webhooks against a fast consumer on 127.0.0.1 (uvicorn serving a tiny ASGI app, in its own
process so that its CPU does not share this process's GIL) and a real database (the `db` fixture:
SQLite, or PostgreSQL when FORGEHAND_TEST_DATABASE_URL is set). Measured in one run:

- policy dispatch round trip: `PolicyDispatcher.dispatch` of a `pre_tool_use` to one policy
  endpoint that answers allow (endpoints read or cached, envelope, signed JWT, strict decoding,
  the delivery-log row handed to the background writer and counted once it is written; the
  source is the `Database`, as the task gate passes it), against a
  bare httpx POST of the same body to the same consumer; p50 and p99 (goal: at most 1.3x each);
- notification throughput: N events published through `forge.db.events.EventBus` (one transaction
  each) with the outbox writer wired by `webhooks.wiring.wire`, then the deliverer started and timed until
  all N are delivered and recorded in the delivery log, against a bare httpx loop posting the same
  bodies one after the other (goal: at least 0.5x).

Figures are printed as ratios against baselines measured in the same run, never asserted as
wall-clock limits. Correctness is asserted: every dispatch allowed and logged, every notification
recorded durably (delivery-log and outbox rows counted), received once per `webhook-id`, in order
per task.

Run: `make bench`.
"""

import asyncio
import logging
import socket
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
from sqlalchemy import func, select

from forge.core.settings import Settings
from forge.db.engine import Database, utcnow
from forge.db.events import AccountRef, Event, EventBus, RunRef, TaskRef, TaskStateChanged
from forge.db.models import Repository
from tests.support.ports import free_port
from tests.support.webhooks import LOOPBACK, make_endpoint, make_repo
from webhooks.core import envelope
from webhooks.core.envelope import RepoRef, TaskMeta
from webhooks.core.models import WebhookDelivery, WebhookOutbox
from webhooks.wiring import WebhooksRuntime, wire

logging.getLogger("httpx").setLevel(logging.WARNING)

POLICY_CALLS = 300
POLICY_WARMUP = 30
POLICY_BLOCK = 25  # ours and bare alternate in blocks, so drift of the machine hits both alike
NOTIFICATIONS = 1000
NOTIFY_TASKS = 100  # the events are spread over this many tasks (rows of one task go out in order)
NOTIFY_WARMUP = 50
ONE_TASK = 100  # the strictly ordered worst case: every event of one task (printed, no goal)
BARE_CONCURRENCY = 8  # context only: a bare client as concurrent as the deliverer's default
JSON = {"content-type": "application/json"}

TASK = TaskRef(id=str(uuid.uuid4()), number=7, url="http://testserver.local/ana/demo/tasks/7")
META = TaskMeta(
    task=TASK,
    run=RunRef(id=str(uuid.uuid4()), seq=1),
    actor=AccountRef(login="ana"),
    agent=AccountRef(login="fixer", type="Bot"),
)
TOOL = {"tool_use_id": "call-1", "tool_name": "bash", "tool_input": {"cmd": "ls -la"}}

# The consumer: `/policy` answers allow, `/notify` answers 200 and records the webhook-id, any
# other POST (the bare baselines) answers 200, `GET /stats` returns what `/notify` received.
CONSUMER = r"""
import json, sys
import uvicorn

ALLOW = b'{"permission":{"decision":"allow"}}'
received = []

async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    more = True
    while more:
        message = await receive()
        more = message.get("more_body", False)
    path = scope["path"]
    payload = b""
    if path == "/policy":
        payload = ALLOW
    elif path == "/notify":
        received.append(dict(scope["headers"]).get(b"webhook-id", b"").decode())
    elif path == "/stats":
        payload = json.dumps(received).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": payload})

uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", access_log=False, lifespan="off")
"""


@contextmanager
def consumer() -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", CONSUMER, str(port)])
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the consumer did not start") from None
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


def p99(samples: list[float]) -> float:
    return statistics.quantiles(samples, n=100, method="inclusive")[98]


def verdict(ok: bool) -> str:
    return "goal met" if ok else "GOAL MISSED"


async def count(db: Database, *where: Any) -> int:
    async with db.session() as s:
        return int((await s.execute(select(func.count(WebhookDelivery.id)).where(*where))).scalar_one())


# -- policy dispatch round trip ----------------------------------------------------------------


async def policy_round_trip(db: Database, runtime: WebhooksRuntime, repo: Repository, base: str) -> None:
    url = f"{base}/policy"
    endpoint, _ = await make_endpoint(db, runtime.config, repo, url, kind="policy", events=["pre_tool_use"])
    ref = RepoRef.of(repo)
    body, _ = envelope.for_policy(
        "pre_tool_use", str(uuid.uuid4()), runtime.config.instance_id, ref, META, TOOL, utcnow()
    )

    async def ours() -> float:
        t0 = time.perf_counter()
        outcome = await runtime.policy.dispatch(db, "pre_tool_use", repo=ref, task_meta=META, data=TOOL)
        elapsed = time.perf_counter() - t0
        assert outcome.decision == "allow" and [r.result for r in outcome.results] == ["ok"], outcome
        return elapsed

    async with httpx.AsyncClient() as client:

        async def bare() -> float:
            t0 = time.perf_counter()
            r = await client.post(url, content=body, headers=JSON)
            elapsed = time.perf_counter() - t0
            assert r.status_code == 200 and r.json() == {"permission": {"decision": "allow"}}
            return elapsed

        for _ in range(POLICY_WARMUP):
            await bare()
            await ours()
        samples: dict[str, list[float]] = {"ours": [], "bare": []}
        runs: dict[str, Callable[[], Awaitable[float]]] = {"ours": ours, "bare": bare}
        for block in range(POLICY_CALLS // POLICY_BLOCK):
            order = ("bare", "ours") if block % 2 == 0 else ("ours", "bare")
            for name in order:
                for _ in range(POLICY_BLOCK):
                    samples[name].append(await runs[name]())

    # Every dispatch left its delivery-log row (written by the background writer, shortly after).
    await runtime.policy.flush_log()
    logged = await count(db, WebhookDelivery.endpoint_id == endpoint.id, WebhookDelivery.result == "ok")
    assert logged == POLICY_WARMUP + POLICY_CALLS, logged

    ours_s, bare_s = samples["ours"], samples["bare"]
    r50 = statistics.median(ours_s) / statistics.median(bare_s)
    r99 = p99(ours_s) / p99(bare_s)
    print(
        f"\npolicy dispatch round trip (pre_tool_use, 1 endpoint answering allow, {len(ours_s)} calls each,"
        f" {len(body)} B body):"
        f"\n  dispatch:  p50 {ms(statistics.median(ours_s))}, p99 {ms(p99(ours_s))}"
        f"\n  bare POST: p50 {ms(statistics.median(bare_s))}, p99 {ms(p99(bare_s))}"
        f"\n  ratio p50 {r50:.2f}x, p99 {r99:.2f}x (goal <= 1.3x each): {verdict(r50 <= 1.3 and r99 <= 1.3)}"
    )


# -- notification throughput -------------------------------------------------------------------


def events_for(repo: Repository, n: int, tasks: int) -> list[Event]:
    refs = [TaskRef(id=str(uuid.uuid4()), number=i + 1) for i in range(tasks)]
    return [
        Event(
            repo_id=repo.id,
            repo_uuid=repo.uuid,
            repository=f"ana/{repo.name}",
            task=refs[i % tasks],
            data=TaskStateChanged(from_="queued", to="running"),
        )
        for i in range(n)
    ]


async def publish(db: Database, bus: EventBus, events: list[Event]) -> float:
    """One transaction per event, as each change makes its own; returns the seconds taken."""
    t0 = time.perf_counter()
    for e in events:
        async with db.session(write=True) as s:
            await bus.publish(s, e)
    return time.perf_counter() - t0


async def until_recorded(db: Database, endpoint_id: int, n: int, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    where = (WebhookDelivery.endpoint_id == endpoint_id, WebhookDelivery.result == "ok")
    while await count(db, *where) < n:
        assert time.monotonic() < deadline, f"not all {n} notifications were recorded within {timeout:.0f} s"
        await asyncio.sleep(0.02)


async def drain_timed(db: Database, runtime: WebhooksRuntime, endpoint_id: int, before: int, n: int) -> float:
    """Start the (warm, stopped) deliverer on a full outbox; seconds until all n are recorded."""
    t0 = time.perf_counter()
    await runtime.deliverer.start()
    await until_recorded(db, endpoint_id, before + n)
    elapsed = time.perf_counter() - t0
    await runtime.deliverer.stop()
    return elapsed


async def notification_throughput(
    db: Database, runtime: WebhooksRuntime, bus: EventBus, repo: Repository, base: str
) -> None:
    url = f"{base}/notify"
    endpoint, _ = await make_endpoint(db, runtime.config, repo, url, events=["task.state_changed"])

    # Warm the deliverer (connections, statement caches) on events it delivers as they come, then stop it.
    warmup = events_for(repo, NOTIFY_WARMUP, NOTIFY_WARMUP)
    await runtime.deliverer.start()
    await publish(db, bus, warmup)
    await until_recorded(db, endpoint.id, NOTIFY_WARMUP)
    await runtime.deliverer.stop()

    # The outbox fills while the deliverer is stopped.
    events = events_for(repo, NOTIFICATIONS, NOTIFY_TASKS)
    published = await publish(db, bus, events)
    async with db.session() as s:
        rows = (
            await s.execute(
                select(WebhookOutbox.body)
                .where(WebhookOutbox.endpoint_id == endpoint.id, WebhookOutbox.state == "pending")
                .order_by(WebhookOutbox.id)
            )
        ).all()
    bodies = [bytes(b) for (b,) in rows]
    assert len(bodies) == NOTIFICATIONS

    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=BARE_CONCURRENCY)) as client:

        async def post(b: bytes) -> None:
            r = await client.post(f"{base}/bare", content=b, headers=JSON)
            assert r.status_code == 200

        for b in bodies[:NOTIFY_WARMUP]:
            await post(b)
        t0 = time.perf_counter()
        for b in bodies:
            await post(b)
        bare_s = time.perf_counter() - t0

        queue = iter(bodies)

        async def poster() -> None:
            for b in queue:
                await post(b)

        t0 = time.perf_counter()
        await asyncio.gather(*(poster() for _ in range(BARE_CONCURRENCY)))
        bare_concurrent_s = time.perf_counter() - t0

        ours_s = await drain_timed(db, runtime, endpoint.id, NOTIFY_WARMUP, NOTIFICATIONS)

        # The strictly ordered worst case: every event of one task, so one row at a time.
        one = events_for(repo, ONE_TASK, 1)
        await publish(db, bus, one)
        one_s = await drain_timed(db, runtime, endpoint.id, NOTIFY_WARMUP + NOTIFICATIONS, ONE_TASK)
        one_bodies = bodies[:ONE_TASK]
        t0 = time.perf_counter()
        for b in one_bodies:
            await post(b)
        one_bare_s = time.perf_counter() - t0

        stats = await client.get(f"{base}/stats")
        received: list[str] = stats.json()

    # Every notification recorded durably: one ok delivery-log row and a delivered outbox row each...
    total = NOTIFY_WARMUP + NOTIFICATIONS + ONE_TASK
    async with db.session() as s:
        logged = (
            await s.execute(
                select(WebhookDelivery.wid, WebhookDelivery.result).where(WebhookDelivery.endpoint_id == endpoint.id)
            )
        ).all()
        states = dict(
            (
                await s.execute(
                    select(WebhookOutbox.state, func.count(WebhookOutbox.id))
                    .where(WebhookOutbox.endpoint_id == endpoint.id)
                    .group_by(WebhookOutbox.state)
                )
            ).all()
        )
    every = [e.id for e in (*warmup, *events, *one)]
    assert {w for w, result in logged if result == "ok"} == set(every)
    assert sum(1 for _, result in logged if result == "ok") == total, "a notification was recorded twice"
    assert states == {"delivered": total}, states
    # ...received once per webhook-id, in order per task.
    assert sorted(received) == sorted(every), "the consumer did not receive each notification exactly once"
    position = {wid: i for i, wid in enumerate(received)}
    by_task: dict[str, list[int]] = {}
    for e in (*events, *one):
        assert e.task is not None
        by_task.setdefault(e.task.id, []).append(position[e.id])
    assert all(p == sorted(p) for p in by_task.values()), "a task's notifications arrived out of order"

    ours_rate, bare_rate = NOTIFICATIONS / ours_s, NOTIFICATIONS / bare_s
    ratio = ours_rate / bare_rate
    print(
        f"\nnotification throughput, outbox to consumer ({NOTIFICATIONS} events over {NOTIFY_TASKS} tasks,"
        f" delivery concurrency {runtime.config.delivery_concurrency}, {db.engine.dialect.name}):"
        f"\n  written to the outbox: {NOTIFICATIONS / published:,.0f} events/s (one transaction each; not in the ratio)"
        f"\n  deliverer: {ours_rate:,.0f}/s ({ours_s:.2f} s), every one recorded in the delivery log"
        f"\n  bare httpx loop: {bare_rate:,.0f}/s ({bare_s:.2f} s)"
        f"\n  ratio {ratio:.2f}x (goal >= 0.5x): {verdict(ratio >= 0.5)}"
        f"\n  context: bare httpx with {BARE_CONCURRENCY} concurrent posters"
        f" {NOTIFICATIONS / bare_concurrent_s:,.0f}/s; all {ONE_TASK} events of one task (strictly in order,"
        f" one row at a time) {ONE_TASK / one_s:,.0f}/s vs a bare loop {ONE_TASK / one_bare_s:,.0f}/s"
        f" ({one_bare_s / one_s:.2f}x, no goal)"
    )


async def test_bench_webhooks(db: Database, settings: Settings) -> None:
    bus = EventBus()
    runtime = wire(bus, settings, db, allow=LOOPBACK, deliver=False)
    repo = await make_repo(db)
    try:
        with consumer() as base:
            await policy_round_trip(db, runtime, repo, base)
            await notification_throughput(db, runtime, bus, repo, base)
    finally:
        await runtime.stop()
