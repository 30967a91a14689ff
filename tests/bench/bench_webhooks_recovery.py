"""Drain of a notification backlog after an outage, against a real receiver on 127.0.0.1 and a
real database: N events over several tasks pile up while the endpoint answers 503 (each task's
head tried twice, its next retry 5 min away), the endpoint comes back and one ping succeeds; timed
until all N are recorded as delivered. Baseline in the same run: the same number of fresh events
(new tasks, the same spread), queued while the deliverer is stopped, then delivered from its start.
The clock of the outbox is frozen, so no scheduled retry can come due: without the catch-up on
recovery the backlog would wait 5 min (the figure printed is a ratio, never asserted).

Run: `make bench`.
"""

import asyncio
import time
from datetime import timedelta

from forge.core.settings import Settings
from forge.db.audit import Actor
from forge.db.engine import Database
from forge.db.events import Event
from forge.db.models import Repository
from tests.support.webhooks import Rig, Seen, event, make_endpoint, make_repo, numbered, receiver, task_ref
from webhooks import service
from webhooks.core.models import WebhookEndpoint

EVENTS = 300
TASKS = 30


def spread(repo: Repository) -> list[Event]:
    tasks = [task_ref() for _ in range(TASKS)]
    return [event(repo, numbered(i // TASKS), tasks[i % TASKS]) for i in range(EVENTS)]


async def delivered(rig: Rig, wids: set[str], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not all(r.state == "delivered" for r in await rig.rows() if r.wid in wids):
        assert time.monotonic() < deadline, "not delivered in time"
        await asyncio.sleep(0.02)


async def test_bench_drain_after_recovery(db: Database, settings: Settings) -> None:
    up = {"ok": False}

    def answer(_: Seen) -> tuple[int, list[tuple[str, str]], bytes]:
        return (200, [], b"") if up["ok"] else (503, [], b"down")

    repo = await make_repo(db)
    async with Rig(db, settings) as rig:
        with receiver(answer) as r:
            endpoint, _ = await make_endpoint(db, rig.cfg, repo, r.url)
            backlog = spread(repo)
            await rig.publish(*backlog)
            await rig.drain()  # each head fails once (next in 5 s)...
            rig.clock.advance(seconds=6.1)
            await rig.drain()  # ...and twice (next in 5 min); the clock stays here from now on
            heads = [x for x in await rig.rows() if x.attempts]
            assert len(heads) == TASKS and all(x.next_attempt_at - rig.clock.now > timedelta(minutes=4) for x in heads)

            up["ok"] = True
            rig.deliverer.poll_interval = 30.0
            await rig.deliverer.start()
            t0 = time.perf_counter()
            async with db.session(write=True) as s:
                e = await s.get(WebhookEndpoint, endpoint.id)
                assert e is not None
                await service.ping(s, Actor.system("bench"), rig.cfg, repo, e)
            rig.deliverer.wake()
            await delivered(rig, {x.id for x in backlog})
            drain_s = time.perf_counter() - t0
            await rig.deliverer.stop()

            fresh = spread(repo)
            await rig.publish(*fresh)
            t0 = time.perf_counter()
            await rig.deliverer.start()
            await delivered(rig, {x.id for x in fresh})
            fresh_s = time.perf_counter() - t0
            await rig.deliverer.stop()
    print(
        f"\nbacklog drain after recovery ({EVENTS} events over {TASKS} tasks, heads tried twice while down,"
        f" next retry 5 min away, {db.engine.dialect.name}):"
        f"\n  after a successful ping: {drain_s:.2f} s; the same number of fresh events: {fresh_s:.2f} s"
        f"\n  ratio {drain_s / fresh_s:.2f}x (without the catch-up: the 5 min retry delay, then a drain)"
    )
