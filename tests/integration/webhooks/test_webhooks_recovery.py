"""Catch-up after an outage, against a real receiver on 127.0.0.1 and a real database: when an
endpoint answers again (a notification or a ping succeeds), its waiting notifications go at once,
in order per task, each once; a flapping endpoint gets the schedule plus at most one catch-up per
row between scheduled attempts, never a hot loop."""

import json
import threading
from datetime import timedelta

import pytest

from forge.core.settings import Settings
from forge.db.audit import Actor
from forge.db.engine import Database
from forge.db.events import TaskRef
from forge.db.models import Repository
from tests.support.waiting import until
from tests.support.webhooks import Rig, Seen, config, event, make_endpoint, make_repo, numbered, receiver, task_ref
from webhooks import service
from webhooks.core.models import WebhookEndpoint, WebhookOutbox
from webhooks.core.outbound import Outbound
from webhooks.delivery.deliverer import Deliverer
from webhooks.delivery.outbox_store import OutboxStore


class Switch:
    """A receiver's answers: 503 while down; `ok` successes left (None: up for good)."""

    def __init__(self) -> None:
        self.ok: int | None = 0
        self.lock = threading.Lock()

    def __call__(self, _: Seen) -> tuple[int, list[tuple[str, str]], bytes]:
        with self.lock:
            if self.ok is None:
                return 200, [], b""
            if self.ok > 0:
                self.ok -= 1
                return 200, [], b""
        return 503, [], b"down"


async def fail_until(rig: Rig, heads: set[str], attempts: int) -> None:
    """Let the schedule try the `heads` rows (the endpoint is down) until each has `attempts`."""
    while any(r.attempts < attempts for r in await rig.rows() if r.wid in heads):
        await rig.drain()
        waiting = [r.next_attempt_at for r in await rig.rows() if r.wid in heads and r.attempts < attempts]
        if waiting:
            rig.clock.now = max([rig.clock.now, *waiting])


async def ping(rig: Rig, db: Database, repo: Repository, endpoint_id: int) -> WebhookOutbox:
    async with db.session(write=True) as s:
        endpoint = await s.get(WebhookEndpoint, endpoint_id)
        assert endpoint is not None
        return await service.ping(s, Actor.system("t"), rig.cfg, repo, endpoint)


async def _all_delivered(rig: Rig) -> bool:
    return all(x.state == "delivered" for x in await rig.rows())


def steps_of(seen: list[Seen], task: TaskRef) -> list[int]:
    bodies = [json.loads(s.body) for s in seen]
    return [b["data"]["queue_position"] for b in bodies if b["type"] != "ping" and b["meta"]["task"]["id"] == task.id]


@pytest.mark.parametrize("trigger", ["event", "ping"])
async def test_a_backlog_drains_at_once_when_the_endpoint_answers_again(
    db: Database, settings: Settings, trigger: str
) -> None:
    repo, switch = await make_repo(db), Switch()
    async with Rig(db, settings) as rig:
        with receiver(switch) as r:
            endpoint, _ = await make_endpoint(db, rig.cfg, repo, r.url)
            a, b, c = task_ref(), task_ref(), task_ref()
            backlog = [event(repo, numbered(i), t) for t in (a, b) for i in range(3)]
            await rig.publish(*backlog)
            await fail_until(rig, {backlog[0].id, backlog[3].id}, 3)  # a and b: next try ~30 min away
            later = [event(repo, numbered(i), c) for i in range(3)]
            await rig.publish(*later)
            await fail_until(rig, {later[0].id}, 2)  # c: next try ~5 min away
            backlog += later
            frozen = rig.clock.now
            rows = await rig.rows()
            heads = [x for x in rows if x.attempts]
            assert len(heads) == 3 and all(x.next_attempt_at - frozen >= timedelta(minutes=4) for x in heads)
            down_requests = len(r.seen)

            switch.ok = None  # back up; the clock stays frozen, so no scheduled retry can come due
            rig.deliverer.poll_interval = 30.0  # only the catch-up (and its wake-up) explains a quick drain
            await rig.deliverer.start()
            try:
                d = task_ref()
                if trigger == "event":
                    fresh = event(repo, None, d)
                    await rig.publish(fresh)
                else:
                    await ping(rig, db, repo, endpoint.id)
                rig.deliverer.wake()  # what the after-commit hook of the writer or the route does
                expected = len(backlog) + 1
                await until(
                    lambda: len(r.seen) - down_requests >= expected,
                    timeout=10,
                    what=f"the backlog ({expected} requests) to drain well before its 5 min retry delay",
                )
                # Anything extra would come from a row claimed again before its attempt was
                # recorded: once every row is recorded as delivered none can be claimed again, and
                # stop() below waits for every send under way, so what the receiver saw is final.
                await until(
                    lambda: _all_delivered(rig), timeout=30, what="every outbox row to be recorded as delivered"
                )
            finally:
                await rig.deliverer.stop()
        assert rig.clock.now == frozen  # every row went well before its scheduled retry
        after = r.seen[down_requests:]
        assert len(after) == expected, "the backlog did not drain within 10 s of a 5 min retry delay"
        wids = [s.headers["webhook-id"] for s in after]
        assert len(set(wids)) == len(wids)  # each exactly once
        assert {e.id for e in backlog} <= set(wids)
        for t in (a, b, c):
            assert steps_of(after, t) == [0, 1, 2]  # in order per task
        assert all(x.state == "delivered" for x in await rig.rows())
        healthy = await rig.endpoint(endpoint.id)
        assert healthy.failing_since is None


async def test_a_flapping_endpoint_gets_the_schedule_plus_one_catch_up_per_recovery(
    db: Database, settings: Settings
) -> None:
    repo, switch = await make_repo(db), Switch()
    async with Rig(db, settings) as rig:
        with receiver(switch) as r:
            endpoint, _ = await make_endpoint(db, rig.cfg, repo, r.url)
            a, b = task_ref(), task_ref()
            events = [event(repo, numbered(i), t) for t in (a, b) for i in range(2)]
            await rig.publish(*events)
            heads = {events[0].id, events[2].id}
            await fail_until(rig, heads, 2)  # two scheduled attempts each; next ~5 min away

            def head_rows(rows: list[WebhookOutbox]) -> list[WebhookOutbox]:
                return [x for x in rows if x.wid in heads]

            # Recovery 1 is a flap: the ping succeeds, then errors again. Each head gets one catch-up
            # attempt, fails, and waits for the schedule (attempt 3 -> 30 min); no loop.
            switch.ok = 1
            await ping(rig, db, repo, endpoint.id)
            assert await rig.drain() == 3  # the ping and the two heads, then nothing is due
            rows = head_rows(await rig.rows())
            assert [x.attempts for x in rows] == [3, 3]
            assert all(x.next_attempt_at - rig.clock.now >= timedelta(minutes=30) for x in rows)
            assert (await rig.endpoint(endpoint.id)).failing_since is not None

            # Recovery 2, another flap: the heads' last attempt was a catch-up, so the schedule keeps them.
            switch.ok = 1
            await ping(rig, db, repo, endpoint.id)
            assert await rig.drain() == 1  # the ping only
            assert [x.attempts for x in head_rows(await rig.rows())] == [3, 3]

            # The schedule tries them again (still down)...
            rig.clock.now = max(x.next_attempt_at for x in head_rows(await rig.rows()))
            assert await rig.drain() == 2
            assert [x.attempts for x in head_rows(await rig.rows())] == [4, 4]

            # ...and recovery 3 is for good: everything goes at once, in order, before the next retry.
            switch.ok = None
            await ping(rig, db, repo, endpoint.id)
            before = rig.clock.now
            await rig.drain()
            assert rig.clock.now == before
        rows = await rig.rows()
        assert all(x.state == "delivered" for x in rows)
        # 3 scheduled attempts and 2 catch-ups (recoveries 1 and 3) each: the schedule plus at most
        # one per recovery.
        assert [x.attempts for x in head_rows(rows)] == [5, 5]
        tried = [s.headers["webhook-id"] for s in r.seen]
        assert all(tried.count(h) == 5 for h in heads)
        assert all(tried.count(e.id) == 1 for e in events if e.id not in heads)
        for t in (a, b):
            assert steps_of(r.seen, t) == [0, 0, 0, 0, 0, 1]


async def test_the_store_wakes_its_deliverer_after_a_catch_up_commits(db: Database, settings: Settings) -> None:
    repo = await make_repo(db)
    cfg = config(settings)
    woken: list[int] = []
    store = OutboxStore(db, cfg, wake=lambda: woken.append(1))
    deliverer = Deliverer(db, cfg, Outbound(cfg.allow), store=store)
    assert store.wake is not None and store.wake is not deliverer.wake  # a given callback is kept
    switch = Switch()
    try:
        with receiver(switch) as r:
            endpoint, _ = await make_endpoint(db, cfg, repo, r.url)
            async with db.session(write=True) as s:
                e = await s.get(WebhookEndpoint, endpoint.id)
                assert e is not None
                for _ in range(2):
                    await service.ping(s, Actor.system("t"), cfg, repo, e)
            # A ping has no retries: a failed one is `failed`, so put a row in backoff by hand.
            async with db.session(write=True) as s:
                waiting = WebhookOutbox(
                    endpoint_id=endpoint.id,
                    wid="w-1",
                    event_type="task.created",
                    subject="s",
                    order_key="task:x",
                    body=b"{}",
                    attempts=2,
                    next_attempt_at=cfg.clock() + timedelta(hours=1),
                )
                s.add(waiting)
            claimed = await store.claim(1)
            await deliverer.record(claimed[0], await deliverer.attempt(claimed[0]))  # fails: failing now
            assert woken == [] and (await store.next_due_in()) == 0
            switch.ok = None
            assert await deliverer.run_once() == 1  # the second ping succeeds: recovery
            assert woken == [1]
            assert await deliverer.run_once() == 1  # the waiting row, an hour early
            assert woken == [1]  # a success of a healthy endpoint catches nothing up
        assert len(r.seen) == 3
    finally:
        await deliverer.outbound.aclose()
