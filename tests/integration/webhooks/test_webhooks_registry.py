"""The policy dispatcher's endpoint cache (`webhooks.policy.endpoint_cache`) against a real database and real
consumers on 127.0.0.1: every change made in this process (through the endpoint service or the
REST API) is honoured by the very next dispatch, whatever the cache's time to live; a change
written by another process (a second engine, plain SQL, no ORM event here) is honoured once the
cached entry expires."""

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, cast

import jwt
import msgspec
import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy import Table, delete, insert, select, update

import webhooks.http
from forge.app.factory import create_app
from forge.core.settings import Settings
from forge.db.audit import Actor
from forge.db.engine import Database
from forge.db.events import AccountRef, EventBus, RunRef, TaskRef
from forge.db.models import Repository
from tests.support.accounts import Accounts
from tests.support.waiting import until
from tests.support.webhooks import LOOPBACK, Receiver, Seen, config, make_endpoint, make_repo, receiver
from webhooks import service
from webhooks.core.envelope import RepoRef, TaskMeta
from webhooks.core.models import WebhookEndpoint
from webhooks.core.outbound import Outbound
from webhooks.core.schemas import HookUpdate
from webhooks.policy import endpoint_cache
from webhooks.policy.dispatcher import PolicyDispatcher, PolicyOutcome
from webhooks.sdk.protocol import decode_secret
from webhooks.wiring import wire

pytestmark = pytest.mark.db

TASK = TaskRef(id=str(uuid.uuid4()), number=3, url="http://testserver.local/ana/demo/tasks/3")
META = TaskMeta(
    task=TASK,
    run=RunRef(id=str(uuid.uuid4()), seq=1),
    actor=AccountRef(login="ana"),
    agent=AccountRef(login="fixer", type="Bot"),
)
TOOL = {"tool_use_id": "call-1", "tool_name": "bash", "tool_input": {"cmd": "ls"}}
ENDPOINTS = cast(Table, WebhookEndpoint.__table__)
# Long enough that nothing in a test expires by time: only the generation can invalidate.
FOREVER = 3600.0


def fails(_: Seen) -> tuple[int, list[tuple[str, str]], bytes]:
    return 500, [], b"nope"


@pytest.fixture
async def repo(db: Database) -> Repository:
    return await make_repo(db)


@pytest.fixture
async def dispatcher(db: Database, settings: Settings) -> AsyncIterator[PolicyDispatcher]:
    cfg = config(settings)
    out = Outbound(cfg.allow)
    d = PolicyDispatcher(db, cfg, out)
    yield d
    await d.aclose()
    await out.aclose()


@pytest.fixture
def pinned(dispatcher: PolicyDispatcher) -> PolicyDispatcher:
    """The dispatcher with a cache that never expires by time (only an in-process change clears it)."""
    dispatcher._cache.ttl = FOREVER
    return dispatcher


async def dispatch(d: PolicyDispatcher, repo: Repository, event: str = "pre_tool_use") -> PolicyOutcome:
    data: dict[str, Any] = TOOL if event == "pre_tool_use" else {"tool_use_id": "c", "tool_name": "bash"}
    if event == "post_tool_use":
        data = {**data, "tool_response": "ok"}
    return await d.dispatch(None, event, repo=RepoRef.of(repo), task_meta=META, data=data)


def called(outcome: PolicyOutcome) -> list[tuple[int, str]]:
    return [(r.endpoint_id, r.url) for r in outcome.results]


def kid_of(seen: Seen) -> str:
    return str(jwt.get_unverified_header(seen.headers["authorization"][7:])["kid"])


async def change(db: Database, settings: Settings, repo: Repository, endpoint_id: int, **fields: Any) -> None:
    async with db.session(write=True) as s:
        endpoint = await service.get_endpoint(s, repo, endpoint_id)
        await service.update_endpoint(s, Actor.system("test"), config(settings), repo, endpoint, HookUpdate(**fields))


# -- in this process: the next dispatch ---------------------------------------------------------


async def test_a_created_endpoint_is_called_by_the_next_dispatch(
    db: Database, settings: Settings, pinned: PolicyDispatcher, repo: Repository
) -> None:
    with receiver() as r:
        assert (await dispatch(pinned, repo)).results == []  # caches "no endpoint" for this repository
        assert pinned._cache.get(repo.id) == []
        endpoint, _ = await make_endpoint(db, config(settings), repo, r.url, kind="policy")
        assert called(await dispatch(pinned, repo)) == [(endpoint.id, r.url)]
        # An instance endpoint made afterwards is called too (and goes first).
        instance, _ = await make_endpoint(db, config(settings), None, r.url, kind="policy")
        assert [i for i, _ in called(await dispatch(pinned, repo))] == [instance.id, endpoint.id]
    assert len(r.seen) == 3


async def test_a_changed_url_is_used_by_the_next_dispatch(
    db: Database, settings: Settings, pinned: PolicyDispatcher, repo: Repository
) -> None:
    with receiver() as old, receiver() as new:
        endpoint, _ = await make_endpoint(db, config(settings), repo, old.url, kind="policy")
        assert called(await dispatch(pinned, repo)) == [(endpoint.id, old.url)]
        await change(db, settings, repo, endpoint.id, url=new.url)
        assert called(await dispatch(pinned, repo)) == [(endpoint.id, new.url)]
    assert len(old.seen) == 1 and len(new.seen) == 1
    assert jwt.decode(new.seen[0].headers["authorization"][7:], options={"verify_signature": False})["aud"] == new.url


async def test_changed_events_are_honoured_by_the_next_dispatch(
    db: Database, settings: Settings, pinned: PolicyDispatcher, repo: Repository
) -> None:
    with receiver() as r:
        endpoint, _ = await make_endpoint(db, config(settings), repo, r.url, kind="policy")
        assert len((await dispatch(pinned, repo, "pre_tool_use")).results) == 1
        assert (await dispatch(pinned, repo, "post_tool_use")).results == []
        await change(db, settings, repo, endpoint.id, events=["post_tool_use"])
        assert (await dispatch(pinned, repo, "pre_tool_use")).results == []
        assert len((await dispatch(pinned, repo, "post_tool_use")).results) == 1
    assert [s.headers["forgehand-event"] for s in r.seen] == ["pre_tool_use", "post_tool_use"]


async def test_deactivating_and_reactivating_is_honoured_by_the_next_dispatch(
    db: Database, settings: Settings, pinned: PolicyDispatcher, repo: Repository
) -> None:
    with receiver(fails) as r:
        endpoint, _ = await make_endpoint(db, config(settings), repo, r.url, kind="policy")
        assert (await dispatch(pinned, repo)).decision == "deny"  # failing, closed
        await change(db, settings, repo, endpoint.id, active=False)
        outcome = await dispatch(pinned, repo)
        assert outcome.decision == "allow" and outcome.results == []
        await change(db, settings, repo, endpoint.id, active=True)
        assert (await dispatch(pinned, repo)).decision == "deny"
    assert len(r.seen) == 2


@pytest.mark.parametrize(("policy", "decision"), [("open", "allow"), ("hold", "ask"), ("closed", "deny")])
async def test_a_changed_failure_policy_decides_the_next_dispatch(
    db: Database, settings: Settings, pinned: PolicyDispatcher, repo: Repository, policy: str, decision: str
) -> None:
    start = "open" if policy == "closed" else "closed"
    with receiver(fails) as r:
        endpoint, _ = await make_endpoint(db, config(settings), repo, r.url, kind="policy", failure_policy=start)
        first = await dispatch(pinned, repo)
        assert first.results[0].failure_policy == start
        await change(db, settings, repo, endpoint.id, failure_policy=policy)
        outcome = await dispatch(pinned, repo)
    assert outcome.results[0].result == "http_error" and outcome.results[0].failure_policy == policy
    assert outcome.decision == decision


async def test_secret_rotation_is_honoured_by_the_next_dispatch(
    db: Database, settings: Settings, pinned: PolicyDispatcher, repo: Repository
) -> None:
    cfg = config(settings)
    actor = Actor.system("test")
    with receiver() as r:
        endpoint, first_secret = await make_endpoint(db, cfg, repo, r.url, kind="policy")
        await dispatch(pinned, repo)
        async with db.session(write=True) as s:
            e = await service.get_endpoint(s, repo, endpoint.id)
            _, next_secret, next_kid = await service.rotate_generate(s, actor, cfg, repo, e)
        await dispatch(pinned, repo)  # staged only: the current secret still signs
        async with db.session(write=True) as s:
            e = await service.get_endpoint(s, repo, endpoint.id)
            await service.rotate_promote(s, actor, cfg, repo, e)
        await dispatch(pinned, repo)  # promoted: the new secret signs at once
        async with db.session(write=True) as s:
            e = await service.get_endpoint(s, repo, endpoint.id)
            await service.rotate_retire(s, actor, cfg, repo, e)
        await dispatch(pinned, repo)
    first_kid = kid_of(r.seen[0])
    assert [kid_of(s) for s in r.seen] == [first_kid, first_kid, next_kid, next_kid]
    for seen, secret in zip(r.seen, [first_secret, first_secret, next_secret, next_secret], strict=True):
        token = seen.headers["authorization"][7:]
        jwt.decode(token, decode_secret(secret), algorithms=["HS256"], audience=r.url)  # signed with that secret


async def test_a_deleted_endpoint_is_not_called_by_the_next_dispatch(
    db: Database, settings: Settings, pinned: PolicyDispatcher, repo: Repository
) -> None:
    with receiver() as gone, receiver() as kept:
        doomed, _ = await make_endpoint(db, config(settings), repo, gone.url, kind="policy")
        other, _ = await make_endpoint(db, config(settings), repo, kept.url, kind="policy")
        assert [i for i, _ in called(await dispatch(pinned, repo))] == [doomed.id, other.id]
        async with db.session(write=True) as s:
            e = await service.get_endpoint(s, repo, doomed.id)
            await service.delete_endpoint(s, Actor.system("test"), repo, e)
        assert called(await dispatch(pinned, repo)) == [(other.id, kept.url)]
        await pinned.flush_log()
    assert len(gone.seen) == 1 and len(kept.seen) == 2


async def test_health_bookkeeping_does_not_invalidate_the_cache(
    db: Database, settings: Settings, pinned: PolicyDispatcher, repo: Repository
) -> None:
    with receiver() as r:
        endpoint, _ = await make_endpoint(db, config(settings), repo, r.url, kind="policy")
        await dispatch(pinned, repo)
        before = endpoint_cache.generation()
        async with db.session(write=True) as s:
            e = await s.get(WebhookEndpoint, endpoint.id)
            assert e is not None
            e.failing_since = e.last_success_at = config(settings).clock()
        assert endpoint_cache.generation() == before
        assert pinned._cache.get(repo.id) is not None


# -- in this process, through the REST API ------------------------------------------------------


@pytest.fixture
def hooks_app(settings: Settings) -> Litestar:
    quiet = msgspec.structs.replace(settings, webhooks_deliver=False, webhooks_allowed_hosts="127.0.0.1")
    app = create_app(quiet)
    if not any(getattr(r, "path", "") == "/api/v1/admin/hooks" for r in app.routes):
        for handler in webhooks.http.ROUTE_HANDLERS:
            app.register(handler)
    app.state.webhooks = wire(EventBus(), quiet, app.state.db, allow=LOOPBACK, deliver=False)
    return app


async def test_changes_made_through_the_api_are_honoured_by_the_next_dispatch(
    hooks_app: Litestar, make: Accounts, db: Database, pinned: PolicyDispatcher
) -> None:
    await make.user("ana")
    repo = await make_repo(db, "ana", "demo")
    auth = {"Authorization": f"Bearer {await make.token('ana', 'webhooks:admin')}"}
    hooks = "/api/v1/repos/ana/demo/hooks"

    async def step() -> PolicyOutcome:
        # The test client blocks this loop while the app serves a request (in a thread of its own):
        # no log batch of the dispatcher may hold SQLite's write lock then, so each dispatch is flushed.
        outcome = await dispatch(pinned, repo)
        await pinned.flush_log()
        return outcome

    async with AsyncTestClient(app=hooks_app, base_url="http://testserver.local") as hc:
        with receiver() as a, receiver(fails) as b:
            assert (await step()).results == []
            created = await hc.post(
                hooks, json={"url": a.url, "kind": "policy", "events": ["pre_tool_use"]}, headers=auth
            )
            assert created.status_code == 201, created.text
            hid = created.json()["hook"]["id"]
            assert called(await step()) == [(hid, a.url)]

            patched = await hc.patch(f"{hooks}/{hid}", json={"url": b.url, "failure_policy": "hold"}, headers=auth)
            assert patched.status_code == 200, patched.text
            outcome = await step()
            assert called(outcome) == [(hid, b.url)] and outcome.decision == "ask" and outcome.held

            assert (await hc.patch(f"{hooks}/{hid}", json={"url": a.url}, headers=auth)).status_code == 200
            staged = await hc.post(f"{hooks}/{hid}/rotate", headers=auth)
            assert (await hc.post(f"{hooks}/{hid}/rotate/promote", headers=auth)).status_code == 200
            await step()
            assert kid_of(a.seen[-1]) == staged.json()["kid"]

            assert (await hc.patch(f"{hooks}/{hid}", json={"active": False}, headers=auth)).status_code == 200
            assert (await step()).results == []
            assert (await hc.patch(f"{hooks}/{hid}", json={"active": True}, headers=auth)).status_code == 200
            assert called(await step()) == [(hid, a.url)]

            assert (await hc.delete(f"{hooks}/{hid}", headers=auth)).status_code == 204
            assert (await step()).results == []
    assert len(a.seen) == 3 and len(b.seen) == 1


# -- another process: within the time to live --------------------------------------------------

Write = Callable[[Any, WebhookEndpoint, Receiver], Awaitable[None]]


async def _deactivate(conn: Any, e: WebhookEndpoint, _: Receiver) -> None:
    await conn.execute(update(ENDPOINTS).where(ENDPOINTS.c.id == e.id).values(active=False))


async def _fail_open(conn: Any, e: WebhookEndpoint, _: Receiver) -> None:
    await conn.execute(update(ENDPOINTS).where(ENDPOINTS.c.id == e.id).values(failure_policy="open"))


async def _move(conn: Any, e: WebhookEndpoint, other: Receiver) -> None:
    await conn.execute(update(ENDPOINTS).where(ENDPOINTS.c.id == e.id).values(url=other.url))


async def _delete(conn: Any, e: WebhookEndpoint, _: Receiver) -> None:
    await conn.execute(delete(ENDPOINTS).where(ENDPOINTS.c.id == e.id))


async def _add(conn: Any, e: WebhookEndpoint, other: Receiver) -> None:
    row = (await conn.execute(select(ENDPOINTS).where(ENDPOINTS.c.id == e.id))).mappings().one()
    values = {k: v for k, v in row.items() if k != "id"}
    values.update(uuid=str(uuid.uuid4()), url=other.url, repo_id=None)  # an instance endpoint: called first
    await conn.execute(insert(ENDPOINTS).values(**values))


def _honoured(name: str, outcome: PolicyOutcome, e: WebhookEndpoint, other: Receiver) -> bool:
    if name in {"deactivate", "delete"}:
        return outcome.results == [] and outcome.decision == "allow"
    if name == "fail_open":
        return outcome.decision == "allow" and [r.failure_policy for r in outcome.results] == ["open"]
    if name == "move":
        return called(outcome) == [(e.id, other.url)]
    return [r.url for r in outcome.results] == [other.url, e.url]  # add: the new instance endpoint first


@pytest.mark.parametrize(
    ("name", "write"),
    [("deactivate", _deactivate), ("fail_open", _fail_open), ("move", _move), ("delete", _delete), ("add", _add)],
)
async def test_a_change_written_by_another_process_is_honoured_once_the_entry_expires(
    db: Database,
    settings: Settings,
    dispatcher: PolicyDispatcher,
    repo: Repository,
    name: str,
    write: Write,
) -> None:
    assert dispatcher._cache.ttl == endpoint_cache.TTL
    with receiver(fails) as r, receiver() as other:
        endpoint, _ = await make_endpoint(db, config(settings), repo, r.url, kind="policy")
        assert (await dispatch(dispatcher, repo)).decision == "deny"  # cached now: one failing, closed endpoint
        elsewhere = Database(settings.effective_database_url)
        try:
            before = endpoint_cache.generation()
            async with elsewhere.engine.begin() as conn:
                await write(conn, endpoint, other)
            assert endpoint_cache.generation() == before  # nothing in this process saw the write
        finally:
            await elsewhere.dispose()
        # Before the entry expires the cached answer may still be used; afterwards the change holds.
        last: list[Any] = []

        async def honoured() -> bool:
            last[:] = [await dispatch(dispatcher, repo)]
            return _honoured(name, last[0], endpoint, other)

        await until(
            honoured,
            timeout=endpoint_cache.TTL + 10,
            what=f"{name} to be honoured",
            show=lambda: f"{called(last[0])} {last[0].decision}",
        )
        # ... and it stays honoured (a background reload never brings the old state back).
        for _ in range(5):
            assert _honoured(name, await dispatch(dispatcher, repo), endpoint, other)
        await dispatcher.flush_log()
