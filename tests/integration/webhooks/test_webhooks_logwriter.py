"""The policy delivery log written in the background (`webhooks.policy.log_writer`), against a real database
and real consumers on 127.0.0.1: rows of clean dispatches appear after `flush_log()`, none are lost
under many concurrent dispatches, rows of an endpoint deleted meanwhile are dropped quietly, a
dispatch with a failed endpoint has its rows written before it returns, rows of a dispatch in the
caller's transaction share its fate, and `aclose()` writes what is pending."""

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import func, select
from structlog.testing import capture_logs

from forge.core.settings import Settings
from forge.db.audit import Actor
from forge.db.engine import Database
from forge.db.events import AccountRef, RunRef, TaskRef
from forge.db.models import Repository
from tests.support.webhooks import Seen, config, make_endpoint, make_repo, receiver
from webhooks import service
from webhooks.core.envelope import RepoRef, TaskMeta
from webhooks.core.models import WebhookDelivery
from webhooks.core.outbound import Outbound
from webhooks.policy import log_writer
from webhooks.policy.dispatcher import PolicyDispatcher, PolicyOutcome

pytestmark = pytest.mark.db

META = TaskMeta(
    task=TaskRef(id=str(uuid.uuid4()), number=5, url="http://testserver.local/ana/demo/tasks/5"),
    run=RunRef(id=str(uuid.uuid4()), seq=1),
    actor=AccountRef(login="ana"),
    agent=AccountRef(login="fixer", type="Bot"),
)
TOOL = {"tool_use_id": "call-1", "tool_name": "bash", "tool_input": {"cmd": "ls"}}


def fails(_: Seen) -> tuple[int, list[tuple[str, str]], bytes]:
    return 500, [], b"nope"


@pytest.fixture
async def repo(db: Database) -> Repository:
    return await make_repo(db)


@pytest.fixture
async def dispatcher(db: Database, settings: Settings) -> AsyncIterator[PolicyDispatcher]:
    cfg = config(settings, policy_concurrency=32)
    out = Outbound(cfg.allow)
    d = PolicyDispatcher(db, cfg, out)
    yield d
    await d.aclose()
    await out.aclose()


async def dispatch(
    d: PolicyDispatcher, repo: Repository, source: Any = None, deadline: float | None = None
) -> PolicyOutcome:
    return await d.dispatch(source, "pre_tool_use", repo=RepoRef.of(repo), task_meta=META, data=TOOL, deadline=deadline)


async def logged(db: Database, **where: Any) -> list[WebhookDelivery]:
    async with db.session() as s:
        stmt = select(WebhookDelivery).filter_by(**where).order_by(WebhookDelivery.id)
        return list((await s.execute(stmt)).scalars())


async def test_rows_of_a_clean_dispatch_are_there_after_flush_log(
    db: Database, settings: Settings, dispatcher: PolicyDispatcher, repo: Repository
) -> None:
    with receiver() as r:
        endpoint, _ = await make_endpoint(db, config(settings), repo, r.url, kind="policy")
        outcome = await dispatch(dispatcher, repo)
        await dispatcher.flush_log()
    assert outcome.decision == "allow" and outcome.results[0].result == "ok"
    rows = await logged(db)
    assert [(d.endpoint_id, d.wid, d.kind, d.event_type, d.attempt, d.result, d.response_status) for d in rows] == [
        (endpoint.id, outcome.delivery_id, "policy", "pre_tool_use", 1, "ok", 200)
    ]
    assert rows[0].request_body == r.seen[0].body
    assert dispatcher.log_writer.dropped == 0
    await dispatcher.flush_log()  # nothing pending: returns at once


async def test_nothing_is_lost_across_many_concurrent_dispatches(
    db: Database, settings: Settings, dispatcher: PolicyDispatcher, repo: Repository
) -> None:
    # 720 rows in all: more than one batch (MAX_BATCH) of them. Sixty at a time, each with the longest
    # deadline: what is checked is the log writer, not how fast a loaded runner answers 120 at once.
    waves, per_wave = 6, 60
    with receiver() as a, receiver() as b:
        first, _ = await make_endpoint(db, config(settings), repo, a.url, kind="policy")
        second, _ = await make_endpoint(db, config(settings), repo, b.url, kind="policy")
        outcomes: list[PolicyOutcome] = []
        for _ in range(waves):  # later waves hand rows over while earlier ones are being written
            outcomes += await asyncio.gather(*(dispatch(dispatcher, repo, deadline=10.0) for _ in range(per_wave)))
        await dispatcher.flush_log()
    assert all(o.decision == "allow" and len(o.results) == 2 for o in outcomes)
    async with db.session() as s:
        stmt = select(WebhookDelivery.endpoint_id, func.count()).group_by(WebhookDelivery.endpoint_id)
        counts: dict[int, int] = {row[0]: row[1] for row in (await s.execute(stmt)).all()}
        wids = set((await s.execute(select(WebhookDelivery.wid))).scalars())
    assert counts == {first.id: waves * per_wave, second.id: waves * per_wave}
    assert wids == {o.delivery_id for o in outcomes}
    assert dispatcher.log_writer.dropped == 0


async def test_rows_of_an_endpoint_deleted_before_the_flush_are_dropped_quietly(
    db: Database, settings: Settings, dispatcher: PolicyDispatcher, repo: Repository, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(log_writer, "LINGER", 0.5)  # the rows are surely still pending when the endpoint goes
    with receiver() as a, receiver() as b:
        doomed, _ = await make_endpoint(db, config(settings), repo, a.url, kind="policy")
        kept, _ = await make_endpoint(db, config(settings), repo, b.url, kind="policy")
        outcomes = [await dispatch(dispatcher, repo) for _ in range(3)]
        async with db.session(write=True) as s:
            endpoint = await service.get_endpoint(s, repo, doomed.id)
            await service.delete_endpoint(s, Actor.system("test"), repo, endpoint)
        with capture_logs() as logs:
            await dispatcher.flush_log()  # raises nothing
    assert [o.results[0].endpoint_id for o in outcomes] == [doomed.id] * 3
    assert await logged(db, endpoint_id=doomed.id) == []
    assert [d.wid for d in await logged(db, endpoint_id=kept.id)] == [o.delivery_id for o in outcomes]
    assert [e for e in logs if e["log_level"] in {"error", "critical"}] == []
    assert dispatcher.log_writer.dropped == 0


async def test_a_dispatch_with_a_failed_endpoint_has_its_rows_written_before_it_returns(
    db: Database, settings: Settings, dispatcher: PolicyDispatcher, repo: Repository, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Were they handed to the background writer, they would wait this long: far past the check.
    monkeypatch.setattr(log_writer, "LINGER", 30.0)
    with receiver() as good, receiver(fails) as bad:
        ok_endpoint, _ = await make_endpoint(db, config(settings), repo, good.url, kind="policy")
        failing, _ = await make_endpoint(db, config(settings), repo, bad.url, kind="policy", failure_policy="open")
        outcome = await dispatch(dispatcher, repo)
        rows = await logged(db, wid=outcome.delivery_id)  # no flush_log()
    assert outcome.decision == "allow" and [r.result for r in outcome.results] == ["ok", "http_error"]
    assert [(d.endpoint_id, d.result) for d in rows] == [(ok_endpoint.id, "ok"), (failing.id, "http_error")]
    assert dispatcher.log_writer._task is None  # nothing was queued for the background


async def test_rows_of_a_dispatch_in_the_callers_transaction_share_its_fate(
    db: Database, settings: Settings, dispatcher: PolicyDispatcher, repo: Repository
) -> None:
    class Rollback(Exception):
        pass

    with receiver() as r:
        await make_endpoint(db, config(settings), repo, r.url, kind="policy")
        with pytest.raises(Rollback):
            async with db.session(write=True) as s:
                undone = await dispatch(dispatcher, repo, s)
                raise Rollback
        async with db.session(write=True) as s:
            kept = await dispatch(dispatcher, repo, s)
    assert [d.wid for d in await logged(db)] == [kept.delivery_id]
    assert undone.delivery_id != kept.delivery_id and dispatcher.log_writer._task is None


async def test_aclose_writes_what_is_pending(
    db: Database, settings: Settings, repo: Repository, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(log_writer, "LINGER", 1.0)
    cfg = config(settings)
    out = Outbound(cfg.allow)
    d = PolicyDispatcher(db, cfg, out)
    try:
        with receiver() as r:
            await make_endpoint(db, cfg, repo, r.url, kind="policy")
            outcomes = [await dispatch(d, repo) for _ in range(5)]
        assert d.log_writer._pending  # still waiting for their batch
        await d.aclose()
    finally:
        await out.aclose()
    assert [row.wid for row in await logged(db)] == [o.delivery_id for o in outcomes]
    assert not d.log_writer._pending
