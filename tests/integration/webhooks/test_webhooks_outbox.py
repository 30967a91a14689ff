"""The notification outbox against real receivers on 127.0.0.1 and a real database: written in the
change's transaction, signed (checked with the independent standardwebhooks verifier), retried on
the contract's schedule under a controlled clock, in order per task, at least once across a crash."""

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
from sqlalchemy import select
from standardwebhooks.webhooks import Webhook

from forge.core.settings import Settings
from forge.db.audit import Actor
from forge.db.engine import Database
from forge.db.events import EventBus, TaskCreated, TaskStateChanged
from forge.db.models import AuditEvent, Repository
from tests.support.ports import free_port
from tests.support.waiting import event as event_set
from tests.support.waiting import until
from tests.support.webhooks import Rig, Seen, config, event, make_endpoint, make_repo, receiver, task_ref
from webhooks import service
from webhooks.core.models import WebhookEndpoint
from webhooks.core.outbound import Outbound
from webhooks.core.schemas import HookUpdate
from webhooks.delivery import schedule as outbox_mod
from webhooks.delivery.deliverer import Deliverer
from webhooks.delivery.outbox_store import OutboxStore
from webhooks.delivery.schedule import RETRY_SCHEDULE
from webhooks.sdk import Verifier

CREATED = TaskCreated()
CHANGED = TaskStateChanged(from_="queued", to="running")


@pytest.fixture
async def rig(db: Database, settings: Settings) -> AsyncIterator[Rig]:
    r = Rig(db, settings)
    yield r
    await r.out.aclose()


@pytest.fixture
async def repo(db: Database) -> Repository:
    return await make_repo(db)


async def test_rows_are_written_in_the_transaction_of_the_change(rig: Rig, db: Database, repo: Repository) -> None:
    other = await make_repo(db, "bob", "elsewhere")
    mine, _ = await make_endpoint(db, rig.cfg, repo, "http://127.0.0.1:1/a")
    instance, _ = await make_endpoint(db, rig.cfg, None, "http://127.0.0.1:1/b", events=["task.created"])
    await make_endpoint(db, rig.cfg, other, "http://127.0.0.1:1/c")  # another repository
    await make_endpoint(db, rig.cfg, repo, "http://127.0.0.1:1/d", events=["repo.pushed"])  # not subscribed
    await make_endpoint(db, rig.cfg, repo, "http://127.0.0.1:1/e", kind="policy")  # not a notify endpoint
    paused, _ = await make_endpoint(db, rig.cfg, repo, "http://127.0.0.1:1/f")
    async with db.session(write=True) as s:
        await service.update_endpoint(
            s, Actor.system("t"), rig.cfg, repo, await s.get(WebhookEndpoint, paused.id), HookUpdate(active=False)
        )  # type: ignore[arg-type]

    with pytest.raises(RuntimeError):
        async with db.session(write=True) as s:
            await rig.bus.publish(s, event(repo))
            raise RuntimeError("the change failed")
    assert await rig.rows() == [] and rig.woken == 0

    e = event(repo, task=task_ref())
    await rig.publish(e)
    rows = await rig.rows()
    assert sorted(r.endpoint_id for r in rows) == sorted([mine.id, instance.id])
    assert {r.wid for r in rows} == {e.id} and rig.woken == 1
    body = json.loads(rows[0].body)
    assert body["type"] == "task.created" and body["data"] == {}  # every type's data: test_webhooks_payloads.py
    assert body["meta"]["delivery_id"] == e.id and body["meta"]["task"]["id"] == e.task.id  # type: ignore[union-attr]


async def test_delivery_is_signed_verifiable_and_logged(rig: Rig, db: Database, repo: Repository) -> None:
    big = b"x" * (100 * 1024)
    with receiver(lambda s: (200, [("X-Answer", "yes")], big)) as r:
        endpoint, secret = await make_endpoint(db, rig.cfg, repo, r.url)
        e = event(repo, CREATED, task_ref())
        await rig.publish(e)
        assert await rig.drain() == 1
    (seen,) = r.seen
    # The independent Standard Webhooks verifier accepts our headers...
    assert Webhook(secret).verify(seen.body, seen.headers)["meta"]["delivery_id"] == e.id
    # ...and the SDK verifies the JWT binding.
    req = Verifier(audience=r.url, secrets=secret, issuer=rig.cfg.instance_id).verify("POST", seen.headers, seen.body)
    assert (req.wid, req.type, seen.headers["webhook-id"]) == (e.id, "task.created", e.id)
    (row,) = await rig.rows()
    assert row.state == "delivered" and row.attempts == 1
    (logged,) = await rig.log()
    assert (logged.result, logged.response_status, logged.attempt, logged.kind) == ("ok", 200, 1, "notify")
    assert bytes(logged.request_body) == seen.body
    assert len(logged.response_body) == 64 * 1024 and logged.response_truncated
    assert ["X-Answer", "yes"] in [list(h) for h in logged.response_headers]
    assert dict(logged.request_headers)["webhook-signature"] == "v1,<redacted>"
    assert (await rig.endpoint(endpoint.id)).last_success_at == rig.clock.now


async def test_receiver_down_for_an_hour_then_everything_in_order(rig: Rig, db: Database, repo: Repository) -> None:
    port = free_port()
    endpoint, secret = await make_endpoint(db, rig.cfg, repo, f"http://127.0.0.1:{port}/hook")
    a, b = task_ref(), task_ref()
    events = [
        event(repo, CREATED, a),
        event(repo, CREATED, b),
        event(repo, CHANGED, a),
        event(repo, CHANGED, b),
        event(repo, CHANGED, a),
    ]
    for e in events:
        await rig.publish(e)
    start = rig.clock.now
    heads = {events[0].id, events[1].id}
    # Down: only the head of each task is tried, on the schedule (+ up to 20 % jitter), never early.
    for base in RETRY_SCHEDULE[:3]:
        tried_at = rig.clock.now
        assert await rig.drain() == 2  # the heads of a and b
        due = {r.wid: r.next_attempt_at for r in await rig.rows() if r.wid in heads}
        for when in due.values():
            assert timedelta(seconds=base) <= when - tried_at <= timedelta(seconds=base * 1.2 + 0.01)
        rig.clock.now = min(due.values()) - timedelta(seconds=1)
        assert await rig.drain() == 0  # a second early: nothing
        rig.clock.now = max(due.values())
    assert await rig.drain() == 2
    assert rig.clock.now - start < timedelta(hours=1)
    assert all(r.attempts == 0 for r in await rig.rows() if r.wid not in {events[0].id, events[1].id})

    def answer(_: Seen) -> tuple[int, list[tuple[str, str]], bytes]:
        return 204, [], b""

    with receiver(answer, port=port) as r:  # back up after an hour
        rig.clock.now = start + timedelta(hours=1)
        await rig.drain()  # nothing due yet at 1 h (the next try is 2 h after the one at ~36 min)
        assert r.seen == []
        rig.clock.now = max(x.next_attempt_at for x in await rig.rows())
        await rig.drain()
    assert all(row.state == "delivered" for row in await rig.rows())
    order = [json.loads(s.body) for s in r.seen]
    for task in (a, b):
        published = [e.id for e in events]
        steps = [published.index(o["meta"]["delivery_id"]) for o in order if o["meta"]["task"]["id"] == task.id]
        assert steps == sorted(steps) and len(steps) == (3 if task is a else 2)
    assert {s.headers["webhook-id"] for s in r.seen} == {e.id for e in events}
    for s in r.seen:
        Webhook(secret).verify(s.body, s.headers)
    log = await rig.log()
    assert sum(1 for d in log if d.result == "connection_error") == 8
    assert (await rig.endpoint(endpoint.id)).failing_since is None


async def test_retry_after_is_honoured_within_the_window(rig: Rig, db: Database, repo: Repository) -> None:
    with receiver(lambda s: (503, [("Retry-After", "3600")], b"busy")) as r:
        await make_endpoint(db, rig.cfg, repo, r.url)
        await rig.publish(event(repo))
        await rig.drain()
    (row,) = await rig.rows()
    assert row.next_attempt_at - rig.clock.now == timedelta(seconds=10.001)  # 2 x base (5 s)
    assert row.last_status == 503 and row.state == "pending"


async def test_gone_disables_the_endpoint_until_re_enabled(rig: Rig, db: Database, repo: Repository) -> None:
    status = {"code": 410}
    with receiver(lambda s: (status["code"], [], b"")) as r:
        endpoint, _ = await make_endpoint(db, rig.cfg, repo, r.url)
        await rig.publish(event(repo, task=task_ref()))
        await rig.drain()
        disabled = await rig.endpoint(endpoint.id)
        assert not disabled.active and "410 Gone" in (disabled.disabled_reason or "")
        await rig.publish(event(repo, task=task_ref()))  # not written: the endpoint is inactive
        rig.clock.advance(hours=1)
        assert await rig.drain() == 0
        status["code"] = 200
        async with db.session(write=True) as s:
            e = await s.get(WebhookEndpoint, endpoint.id)
            assert e is not None
            await service.update_endpoint(s, Actor.system("t"), rig.cfg, repo, e, HookUpdate(active=True))
        assert await rig.drain() == 1
    assert len(r.seen) == 2 and [row.state for row in await rig.rows()] == ["delivered"]
    enabled = await rig.endpoint(endpoint.id)
    assert enabled.active and enabled.disabled_reason is None
    async with db.session() as s:
        actions = [a for (a,) in (await s.execute(select(AuditEvent.action).order_by(AuditEvent.id))).all()]
    assert "webhook.disable" in actions and actions[-1] == "webhook.update"


async def test_failing_for_five_days_disables_with_a_notice_and_rows_give_up(
    rig: Rig, db: Database, repo: Repository
) -> None:
    with receiver(lambda s: (500, [], b"")) as r:
        endpoint, _ = await make_endpoint(db, rig.cfg, repo, r.url)
        await rig.publish(event(repo, task=task_ref()))
        start = rig.clock.now
        next_event = start + timedelta(hours=12)
        while (await rig.endpoint(endpoint.id)).active and rig.clock.now - start < timedelta(days=6):
            await rig.drain()
            pending = [x.next_attempt_at for x in await rig.rows() if x.state == "pending"]
            rig.clock.now = min([*pending, next_event])
            if rig.clock.now == next_event:  # new events keep coming (and failing) twice a day
                await rig.publish(event(repo, task=task_ref()))
                next_event += timedelta(hours=12)
    e = await rig.endpoint(endpoint.id)
    assert not e.active and e.disabled_reason and "every delivery failed since" in e.disabled_reason
    assert timedelta(days=5) <= rig.clock.now - start <= timedelta(days=5, hours=12)
    rows = await rig.rows()
    assert rows[0].state == "failed" and rows[0].attempts == 1 + len(RETRY_SCHEDULE)
    assert len(r.seen) >= 10


async def test_a_claim_abandoned_mid_delivery_is_delivered_again_with_the_same_webhook_id(
    rig: Rig, db: Database, settings: Settings, repo: Repository
) -> None:
    with receiver(lambda s: (200, [], b"")) as r:
        await make_endpoint(db, rig.cfg, repo, r.url)
        e = event(repo, task=task_ref())
        await rig.publish(e)
        # Worker A claims and posts, then dies before recording anything.
        (claimed,) = await rig.deliverer.claim()
        await rig.deliverer.attempt(claimed)
        # Worker B: nothing to do while A's lease runs...
        other = Deliverer(db, rig.cfg, rig.out)
        assert await other.run_once() == 0
        rig.clock.advance(seconds=61)  # ...then the lease has expired.
        assert await other.run_once() == 1
    assert [s.headers["webhook-id"] for s in r.seen] == [e.id, e.id]
    assert r.seen[0].body == r.seen[1].body
    assert [row.state for row in await rig.rows()] == ["delivered"]


async def test_endpoint_deleted_while_deliveries_are_pending_or_in_flight(
    rig: Rig, db: Database, repo: Repository
) -> None:
    with receiver() as r:
        endpoint, _ = await make_endpoint(db, rig.cfg, repo, r.url)
        await rig.publish(event(repo, task=task_ref()), event(repo, task=task_ref()))
        claimed = await rig.deliverer.claim()
        attempt = await rig.deliverer.attempt(claimed[0])
        async with db.session(write=True) as s:
            e = await s.get(WebhookEndpoint, endpoint.id)
            assert e is not None
            await service.delete_endpoint(s, Actor.system("t"), repo, e)
        await rig.deliverer.record(claimed[0], attempt)  # in flight when deleted: no error
        rig.clock.advance(minutes=5)
        assert await rig.drain() == 0
    assert await rig.rows() == [] and await rig.log() == []


async def test_notification_attempt_has_a_total_timeout(
    rig: Rig, db: Database, repo: Repository, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(outbox_mod, "TOTAL_TIMEOUT", 0.4)
    # The receiver answers after 1.5 s (the scenario: past the 0.4 s total timeout).
    with receiver(lambda s: (time.sleep(1.5), (200, [], b""))[1]) as r:
        await make_endpoint(db, rig.cfg, repo, r.url)
        await rig.publish(event(repo))
        t0 = time.monotonic()
        await rig.drain()
        assert time.monotonic() - t0 < 1.2
    (logged,) = await rig.log()
    assert logged.result == "timeout" and (await rig.rows())[0].state == "pending"


KILLED_WORKER = """
import asyncio, json, sys
from pathlib import Path
from forge.db.engine import Database
from forge.core.settings import load_settings
from webhooks.core.config import WebhooksConfig
from webhooks.core.outbound import Outbound
from webhooks.delivery.deliverer import Deliverer
from forge.core.urlguard import AllowList

values = json.loads(sys.argv[1])
values["data_dir"] = Path(values["data_dir"])
settings = load_settings(environ={}, **values)

async def main():
    db = Database(settings.effective_database_url)
    cfg = WebhooksConfig.from_settings(settings, allow=AllowList.parse("127.0.0.1"), delivery_concurrency=2)
    deliverer = Deliverer(db, cfg, Outbound(cfg.allow), poll_interval=0.05)
    await deliverer.run()

asyncio.run(main())
"""


async def test_deliverer_killed_with_sigkill_loses_nothing(
    rig: Rig, db: Database, settings: Settings, repo: Repository
) -> None:
    def slow(_: Seen) -> tuple[int, list[tuple[str, str]], bytes]:
        time.sleep(0.4)  # the scenario: deliveries take a while, so the kill lands amid some
        return 200, [], b""

    with receiver(slow) as r:
        await make_endpoint(db, rig.cfg, repo, r.url)
        tasks = [task_ref() for _ in range(3)]
        events = [event(repo, CHANGED, t) for _ in range(3) for t in tasks]
        for e in events:
            await rig.publish(e)
        values = {
            "data_dir": str(settings.data_dir),
            "database_url": settings.effective_database_url,
            "secret_key": settings.secret_key,
            "instance_id": settings.instance_id,
            "log_level": "error",
        }
        env = {**os.environ, "PYTHONPATH": os.getcwd()}
        proc = subprocess.Popen([sys.executable, "-c", KILLED_WORKER, json.dumps(values)], env=env)
        try:
            await until(lambda: len(r.seen) >= 3, timeout=30, what="the worker to deliver three notifications")
            assert len(r.seen) >= 3, "the worker never delivered"
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
        before = len(r.seen)
        assert any(row.state == "pending" for row in await rig.rows()), "killed too late to prove anything"
        # A new deliverer after the leases ran out delivers the rest.
        rig.clock.advance(minutes=2)
        while await rig.drain():
            rig.clock.advance(seconds=1)
        # The old worker's orphaned requests finish being recorded by the receiver.
        await until(lambda: r.receiving == 0, timeout=10, what="the receiver to record every request under way")
    assert all(row.state == "delivered" for row in await rig.rows())
    ids = [s.headers["webhook-id"] for s in r.seen]
    assert set(ids) == {e.id for e in events} and len(r.seen) > before
    bodies: dict[str, bytes] = {}
    for s in r.seen:  # a duplicate is the same notification: same webhook-id, same bytes
        assert bodies.setdefault(s.headers["webhook-id"], s.body) == s.body
    first_seen = list(dict.fromkeys(json.loads(s.body)["meta"]["delivery_id"] for s in r.seen))
    position = {wid: i for i, wid in enumerate(first_seen)}
    for t in tasks:
        mine = [e.id for e in events if e.task == t]
        assert [position[w] for w in mine] == sorted(position[w] for w in mine)


async def test_runtime_loop_delivers_right_after_the_commit(db: Database, settings: Settings, repo: Repository) -> None:
    from webhooks.core import metrics
    from webhooks.wiring import wire

    bus = EventBus()
    runtime = wire(bus, settings, db, allow=config(settings).allow)
    runtime.deliverer.poll_interval = 30.0  # only the wake-up after the commit can explain a quick delivery
    before = metrics.DELIVERIES.labels(event="task.created", result="ok")._value.get()
    idle = asyncio.Event()
    due_in = runtime.deliverer.store.next_due_in

    async def next_due_in() -> float | None:
        due = await due_in()
        idle.set()  # the loop found nothing to claim: it waits for a wake-up (or its 30 s poll)
        return due

    runtime.deliverer.store.next_due_in = next_due_in  # type: ignore[method-assign]
    with receiver() as r:
        await make_endpoint(db, runtime.config, repo, r.url)
        await runtime.start()
        await event_set(idle, timeout=30, what="the delivery loop to be idle, waiting")
        try:
            e = event(repo, task=task_ref())
            t0 = time.monotonic()
            async with db.session(write=True) as s:
                await bus.publish(s, e)
            await until(lambda: r.seen, timeout=5, interval=0.01, what="the notification to be delivered")
            assert r.seen and time.monotonic() - t0 < 1.0
        finally:
            await runtime.stop()
    assert r.seen[0].headers["webhook-id"] == e.id
    assert metrics.DELIVERIES.labels(event="task.created", result="ok")._value.get() == before + 1


async def test_an_idle_deliverer_only_counts_rows_it_could_claim(rig: Rig, db: Database, repo: Repository) -> None:
    assert await rig.deliverer.next_due_in() is None
    with receiver(lambda s: (503, [], b"")) as r:
        endpoint, _ = await make_endpoint(db, rig.cfg, repo, r.url)
        task = task_ref()
        await rig.publish(event(repo, task=task), event(repo, task=task))
        assert await rig.deliverer.next_due_in() == 0
        (claimed,) = await rig.deliverer.claim()  # the head is leased; the second row waits behind it
        assert await rig.deliverer.next_due_in() == 60.0
        await rig.deliverer.record(claimed, await rig.deliverer.attempt(claimed))
        due = await rig.deliverer.next_due_in()
        assert due is not None and 5 <= due <= 6  # the head's retry; the row behind it does not count
        async with db.session(write=True) as s:
            e = await s.get(WebhookEndpoint, endpoint.id)
            assert e is not None
            e.active = False
        assert await rig.deliverer.next_due_in() is None  # a paused endpoint's rows never make it spin


async def test_the_deliverer_holds_its_store_and_sends_what_that_store_claims(
    db: Database, settings: Settings, repo: Repository
) -> None:
    cfg = config(settings)
    store = OutboxStore(db, cfg, batch=1)
    deliverer = Deliverer(db, cfg, Outbound(cfg.allow), store=store)
    assert deliverer.store is store and not isinstance(deliverer, OutboxStore)
    with receiver() as r:
        endpoint, _ = await make_endpoint(db, cfg, repo, r.url)
        async with db.session(write=True) as s:
            for _ in range(2):
                await service.ping(s, Actor.system("t"), cfg, repo, endpoint)
        assert await deliverer.run_once() == 1  # the store's batch of one
        assert await deliverer.run_once() == 1
        assert await deliverer.run_once() == 0
    assert len(r.seen) == 2
    await deliverer.outbound.aclose()
