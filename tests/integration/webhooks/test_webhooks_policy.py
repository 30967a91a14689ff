"""Policy dispatch against real consumers on 127.0.0.1 and a real database: combination, overrides,
deadlines, the one retry, capacity, failure policies, strict decoding and the delivery log."""

import asyncio
import io
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

import jwt
import msgspec
import pytest
from sqlalchemy import select

from forge.core.settings import Settings
from forge.db.engine import Database
from forge.db.events import AccountRef, RunRef, TaskRef
from forge.db.models import Repository
from tests.support.ports import free_port
from tests.support.waiting import until
from tests.support.webhooks import Drop, Seen, config, make_endpoint, make_repo, receiver
from webhooks import service
from webhooks.core.envelope import RepoRef, TaskMeta
from webhooks.core.models import WebhookDelivery
from webhooks.policy.dispatcher import PolicyDispatcher
from webhooks.sdk import Consumer, HookRequest, Verifier, allow, ask, deny
from webhooks.sdk.reference import make_consumer, make_server

TASK = TaskRef(id=str(uuid.uuid4()), number=7, url="http://testserver.local/ana/demo/tasks/7")
META = TaskMeta(
    task=TASK,
    run=RunRef(id=str(uuid.uuid4()), seq=1),
    actor=AccountRef(login="ana"),
    agent=AccountRef(login="fixer", type="Bot"),
)
TOOL = {"tool_use_id": "call-1", "tool_name": "bash", "tool_input": {"cmd": "ls"}}


@contextmanager
def sdk_consumer(url_holder: list[str], secret_holder: list[str], **callbacks: Any) -> Iterator[Any]:
    """An SDK consumer served by the stdlib server; its audience/secret are filled in once known."""
    state: dict[str, Any] = {}

    class Lazy:
        def handle(self, method: str, headers: Any, body: bytes) -> Any:
            if "c" not in state:
                state["c"] = Consumer(Verifier(audience=url_holder[0], secrets=secret_holder), policy=callbacks)
            return state["c"].handle(method, headers, body)

    def respond(seen: Seen) -> tuple[int, list[tuple[str, str]], bytes]:
        r = Lazy().handle("POST", list(seen.headers.items()), seen.body)
        return r.status, r.headers, r.body

    with receiver(respond) as rec:
        yield rec


@pytest.fixture
async def repo(db: Database) -> Repository:
    return await make_repo(db)


@pytest.fixture
async def dispatcher(db: Database, settings: Settings) -> AsyncIterator[PolicyDispatcher]:
    from webhooks.core.outbound import Outbound

    cfg = config(settings)
    out = Outbound(cfg.allow)
    yield PolicyDispatcher(db, cfg, out)
    await out.aclose()


async def policy_endpoint(
    db: Database, settings: Settings, repo: Repository | None, url: str, **kw: Any
) -> tuple[int, str]:
    endpoint, secret = await make_endpoint(db, config(settings), repo, url, kind="policy", **kw)
    return endpoint.id, secret


def jti_of(seen: Seen) -> str:
    return str(jwt.decode(seen.headers["authorization"][7:], options={"verify_signature": False})["jti"])


async def test_no_endpoint_allows_without_calling_anything(dispatcher: PolicyDispatcher, repo: Repository) -> None:
    outcome = await dispatcher.dispatch(None, "pre_tool_use", repo=RepoRef.of(repo), task_meta=META, data=TOOL)
    assert outcome.decision == "allow" and outcome.results == [] and outcome.input_override is None


async def test_stable_order_overrides_chain_and_deny_beats_ask_beats_allow(
    db: Database, settings: Settings, dispatcher: PolicyDispatcher, repo: Repository
) -> None:
    urls: dict[str, list[str]] = {"a": [], "b": [], "c": []}
    secrets: dict[str, list[str]] = {"a": [], "b": [], "c": []}
    seen_inputs: list[tuple[str, Any]] = []

    def a(req: HookRequest) -> dict[str, Any]:
        seen_inputs.append(("a", req.data["tool_input"]))
        return allow({"cmd": "ls -la"}, model_context="ctx-a", user_message="msg-a")

    def b(req: HookRequest) -> dict[str, Any]:
        seen_inputs.append(("b", req.data["tool_input"]))
        return ask("a person should look", model_context="ctx-b")

    def c(req: HookRequest) -> dict[str, Any]:
        seen_inputs.append(("c", req.data["tool_input"]))
        return deny("not on my watch", user_message="msg-c")

    with (
        sdk_consumer(urls["a"], secrets["a"], pre_tool_use=a) as ra,
        sdk_consumer(urls["b"], secrets["b"], pre_tool_use=b) as rb,
        sdk_consumer(urls["c"], secrets["c"], pre_tool_use=c) as rc,
    ):
        # The repository endpoint is created first, the instance one second: instance endpoints still go first.
        b_id, secret_b = await policy_endpoint(db, settings, repo, rb.url)
        a_id, secret_a = await policy_endpoint(db, settings, None, ra.url)
        urls["a"].append(ra.url), urls["b"].append(rb.url), secrets["a"].append(secret_a), secrets["b"].append(secret_b)

        outcome = await dispatcher.dispatch(None, "pre_tool_use", repo=RepoRef.of(repo), task_meta=META, data=TOOL)
        assert [r.endpoint_id for r in outcome.results] == [a_id, b_id]
        assert [r.result for r in outcome.results] == ["ok", "asked"]
        assert seen_inputs == [("a", {"cmd": "ls"}), ("b", {"cmd": "ls -la"})]  # b saw a's override
        assert outcome.decision == "ask" and outcome.reason == "a person should look" and not outcome.held
        assert outcome.input_override == {"cmd": "ls -la"}
        assert outcome.model_contexts == ["ctx-a", "ctx-b"] and outcome.user_messages == ["msg-a"]
        assert outcome.deciding is not None and outcome.deciding.endpoint_id == b_id

        c_id, secret_c = await policy_endpoint(db, settings, repo, rc.url)
        urls["c"].append(rc.url), secrets["c"].append(secret_c)
        seen_inputs.clear()
        outcome = await dispatcher.dispatch(None, "pre_tool_use", repo=RepoRef.of(repo), task_meta=META, data=TOOL)
        assert [r.result for r in outcome.results] == ["ok", "asked", "denied"]
        assert outcome.decision == "deny" and outcome.reason == "not on my watch"
        assert outcome.deciding is not None and outcome.deciding.endpoint_id == c_id
        assert outcome.user_messages == ["msg-a", "msg-c"] and outcome.failure is None
        # every endpoint got the same wid for this dispatch
        wids = {s.headers["forgehand-delivery"] for r in (ra, rb, rc) for s in r.seen[-1:]}
        assert wids == {outcome.delivery_id}


async def test_first_deny_ends_the_dispatch(
    db: Database, settings: Settings, dispatcher: PolicyDispatcher, repo: Repository
) -> None:
    deny_body = json.dumps({"permission": {"decision": "deny", "reason": "no"}}).encode()
    with receiver(lambda s: (200, [], deny_body)) as first, receiver() as second:
        await policy_endpoint(db, settings, repo, first.url)
        await policy_endpoint(db, settings, repo, second.url)
        outcome = await dispatcher.dispatch(None, "pre_tool_use", repo=RepoRef.of(repo), task_meta=META, data=TOOL)
    assert outcome.decision == "deny" and len(first.seen) == 1 and second.seen == []


async def test_hanging_consumer_is_abandoned_within_the_deadline(
    db: Database, settings: Settings, dispatcher: PolicyDispatcher, repo: Repository
) -> None:
    release = threading.Event()

    def hang(_: Seen) -> tuple[int, list[tuple[str, str]], bytes]:
        release.wait(10)
        return 200, [], b""

    with receiver(hang) as r:
        await policy_endpoint(db, settings, repo, r.url)
        started = time.monotonic()
        outcome = await dispatcher.dispatch(
            None, "pre_tool_use", repo=RepoRef.of(repo), task_meta=META, data=TOOL, deadline=0.5
        )
        elapsed = time.monotonic() - started
        release.set()
    # Abandoned at the deadline, not after the consumer's 10 s (the upper bound has room for a loaded runner).
    assert 0.5 <= elapsed < 5, elapsed
    assert outcome.decision == "deny" and outcome.results[0].result == "timeout"
    assert outcome.failure_message == f"hook dispatch failed: pre_tool_use: timeout (delivery {outcome.delivery_id})"
    async with db.session() as s:
        rows = (await s.execute(select(WebhookDelivery))).scalars().all()
    assert [(d.result, d.kind, d.wid) for d in rows] == [("timeout", "policy", outcome.delivery_id)]


async def test_the_configured_deadline_applies_when_the_caller_names_none(
    db: Database, settings: Settings, repo: Repository
) -> None:
    """`FORGEHAND_WEBHOOKS_POLICY_DEADLINE_SECONDS` is the deadline of every dispatch the task core
    asks for: the consumer reads it in the token, whose `exp` is `iat` + the deadline + 30 s."""
    from webhooks.core.outbound import Outbound

    lifetimes: list[int] = []

    def answer(seen: Seen) -> tuple[int, list[tuple[str, str]], bytes]:
        claims = jwt.decode(seen.headers["authorization"][7:], options={"verify_signature": False})
        lifetimes.append(claims["exp"] - claims["iat"])
        return 200, [], b""

    with receiver(answer) as r:
        await policy_endpoint(db, settings, repo, r.url)
        for deadline, lifetime in ((9.0, 39), (5.0, 35)):
            cfg = config(msgspec.structs.replace(settings, webhooks_policy_deadline_seconds=deadline))
            out = Outbound(cfg.allow)
            try:
                await PolicyDispatcher(db, cfg, out).dispatch(
                    None, "pre_tool_use", repo=RepoRef.of(repo), task_meta=META, data=TOOL
                )
            finally:
                await out.aclose()
            assert lifetimes[-1] == lifetime, (deadline, lifetimes)


@pytest.mark.parametrize(
    ("policy", "decision", "held"), [("closed", "deny", False), ("open", "allow", False), ("hold", "ask", True)]
)
async def test_failure_policy_decides_what_a_failure_means(
    db: Database,
    settings: Settings,
    dispatcher: PolicyDispatcher,
    repo: Repository,
    policy: str,
    decision: str,
    held: bool,
) -> None:
    with receiver(lambda s: (500, [], b"oops")) as r:
        await policy_endpoint(db, settings, repo, r.url, failure_policy=policy)
        outcome = await dispatcher.dispatch(None, "pre_tool_use", repo=RepoRef.of(repo), task_meta=META, data=TOOL)
    assert outcome.decision == decision and outcome.held is held
    assert outcome.results[0].result == "http_error" and outcome.results[0].attempts == 1
    assert (outcome.failure is not None) is (policy != "open")
    assert outcome.failures and outcome.failures[0].status == 500


async def test_connection_error_is_retried_once_after_250ms_with_a_new_jti(
    db: Database, settings: Settings, dispatcher: PolicyDispatcher, repo: Repository
) -> None:
    calls = {"n": 0}

    def drop_first(_: Seen) -> tuple[int, list[tuple[str, str]], bytes]:
        calls["n"] += 1
        if calls["n"] == 1:
            raise Drop
        return 200, [], b'{"model_context":"second try"}'

    with receiver(drop_first) as r:
        await policy_endpoint(db, settings, repo, r.url)
        outcome = await dispatcher.dispatch(None, "pre_tool_use", repo=RepoRef.of(repo), task_meta=META, data=TOOL)
    result = outcome.results[0]
    assert (result.result, result.attempts, outcome.model_contexts) == ("ok", 2, ["second try"])
    first, second = r.seen
    assert first.body == second.body and jti_of(first) != jti_of(second)
    assert first.headers["forgehand-delivery"] == second.headers["forgehand-delivery"]
    assert second.at - first.at >= 0.25

    # Nobody listening: two attempts, then a connection error (and the log has both).
    port = free_port()
    endpoint_id, _ = await policy_endpoint(db, settings, repo, f"http://127.0.0.1:{port}/gone")
    async with db.session(write=True) as s:  # only the dead endpoint now
        from webhooks.core.models import WebhookEndpoint

        for e in (await s.execute(select(WebhookEndpoint))).scalars():
            e.active = e.id == endpoint_id
    started = time.monotonic()
    outcome = await dispatcher.dispatch(None, "pre_tool_use", repo=RepoRef.of(repo), task_meta=META, data=TOOL)
    assert time.monotonic() - started >= 0.25
    assert (outcome.results[0].result, outcome.results[0].attempts, outcome.decision) == ("connection_error", 2, "deny")
    async with db.session() as s:
        rows = (
            (await s.execute(select(WebhookDelivery).where(WebhookDelivery.endpoint_id == endpoint_id))).scalars().all()
        )
    assert [d.attempt for d in rows] == [1, 2] and len({d.jti for d in rows}) == 2


@pytest.mark.parametrize(
    "respond",
    [
        lambda s: (503, [], b""),
        lambda s: (302, [("Location", "http://127.0.0.1:1/")], b""),
        lambda s: (200, [], b"null"),
        lambda s: (200, [], b'{"permission":{"decision":"allow"}} trailing'),
    ],
    ids=["503", "redirect", "null", "trailing-data"],
)
async def test_no_retry_on_http_or_protocol_errors(
    db: Database, settings: Settings, dispatcher: PolicyDispatcher, repo: Repository, respond: Any
) -> None:
    with receiver(respond) as r:
        await policy_endpoint(db, settings, repo, r.url)
        outcome = await dispatcher.dispatch(None, "pre_tool_use", repo=RepoRef.of(repo), task_meta=META, data=TOOL)
    assert len(r.seen) == 1 and outcome.results[0].attempts == 1
    assert outcome.results[0].result in {"http_error", "protocol_error"} and outcome.decision == "deny"


async def test_timeout_is_not_retried(
    db: Database, settings: Settings, dispatcher: PolicyDispatcher, repo: Repository
) -> None:
    # The consumer answers after 0.6 s (the scenario: past the 0.3 s deadline).
    with receiver(lambda s: (time.sleep(0.6), (200, [], b""))[1]) as r:
        await policy_endpoint(db, settings, repo, r.url)
        outcome = await dispatcher.dispatch(
            None, "pre_tool_use", repo=RepoRef.of(repo), task_meta=META, data=TOOL, deadline=0.3
        )
    assert outcome.results[0].result == "timeout" and outcome.results[0].attempts == 1 and len(r.seen) == 1


async def test_malformed_answers_are_never_read_as_allow(
    db: Database, settings: Settings, dispatcher: PolicyDispatcher, repo: Repository
) -> None:
    bodies = [
        b'{"permission":{"decision":"allow"},"permission":{"decision":"allow"}}',
        b'{"Permission":{"decision":"allow"},"permission":{"decision":"allow"}}',
        b'{"permission":{"decision":"allow"},"surprise":true}',
        json.dumps({"model_context": "x" * 20000}).encode(),
        b"[" * 200 + b"]" * 200,
    ]
    for body in bodies:
        with receiver(lambda s, body=body: (200, [], body)) as r:
            await policy_endpoint(db, settings, repo, r.url, events=["pre_tool_use", "user_prompt_submit"])
            outcome = await dispatcher.dispatch(None, "pre_tool_use", repo=RepoRef.of(repo), task_meta=META, data=TOOL)
            assert outcome.decision == "deny" and outcome.results[-1].result == "protocol_error", body[:60]
            async with db.session(write=True) as s:
                for e in await service.list_endpoints(s, repo):
                    await s.delete(e)
    # allow on user_prompt_submit without the prompt override
    with receiver(lambda s: (200, [], b'{"permission":{"decision":"allow"}}')) as r:
        await policy_endpoint(db, settings, repo, r.url, events=["user_prompt_submit"])
        outcome = await dispatcher.dispatch(
            None, "user_prompt_submit", repo=RepoRef.of(repo), task_meta=META, data={"prompt": "hi", "kind": "goal"}
        )
    assert outcome.decision == "deny" and outcome.results[0].result == "protocol_error"


async def test_response_over_one_mebibyte_is_a_protocol_error(
    db: Database, settings: Settings, dispatcher: PolicyDispatcher, repo: Repository
) -> None:
    big = json.dumps({"user_message": "x" * (1024 * 1024 + 10)}).encode()
    with receiver(lambda s: (200, [], big)) as r:
        await policy_endpoint(db, settings, repo, r.url)
        outcome = await dispatcher.dispatch(None, "pre_tool_use", repo=RepoRef.of(repo), task_meta=META, data=TOOL)
    assert outcome.results[0].result == "protocol_error" and "over" in outcome.results[0].detail


async def test_deadline_is_shared_by_the_capacity_wait_and_the_retry(
    db: Database, settings: Settings, repo: Repository
) -> None:
    from webhooks.core.outbound import Outbound

    cfg = config(settings, policy_concurrency=1)
    out = Outbound(cfg.allow)
    one_slot = PolicyDispatcher(db, cfg, out)
    other = await make_repo(db, "bob", "other")
    third = await make_repo(db, "cy", "third")
    release = threading.Event()
    try:
        with receiver(lambda s: (release.wait(3), (200, [], b""))[1]) as slow:
            await policy_endpoint(db, settings, repo, slow.url)
            await policy_endpoint(db, settings, other, f"http://127.0.0.1:{free_port()}/refused")
            await policy_endpoint(db, settings, third, f"http://127.0.0.1:{free_port()}/refused")

            async def run(r: Repository, deadline: float) -> tuple[Any, float]:
                t0 = time.monotonic()
                o = await one_slot.dispatch(
                    None, "pre_tool_use", repo=RepoRef.of(r), task_meta=META, data=TOOL, deadline=deadline
                )
                return o, time.monotonic() - t0

            # The endpoints are read (and cached) first, so that only the slot and the calls
            # spend the deadlines below, however slow the database is on a loaded machine.
            for r in (repo, other, third):
                await one_slot._targets(None, r.id, "pre_tool_use")
            holder = asyncio.create_task(run(repo, 0.6))  # holds the only slot for 0.6 s
            # Until it holds the slot (its request is at the consumer).
            await until(lambda: slow.seen, timeout=1, interval=0.005, what="the first dispatch to reach its consumer")
            assert slow.seen, "the first dispatch never reached its consumer"
            (starved, waited), (squeezed, took) = await asyncio.gather(
                run(other, 0.4),  # gives up waiting for the slot
                run(third, 0.75),  # gets the slot when the first times out: one attempt, no time to retry
            )
            assert starved.results[0].result == "over_capacity" and starved.results[0].attempts == 0
            assert 0.4 <= waited < 0.5  # abandoned at its deadline (+ 100 ms at most)
            assert squeezed.results[0].result == "connection_error" and squeezed.results[0].attempts == 1
            assert took < 0.85
            held, _ = await holder
            assert held.results[0].result == "timeout"
            release.set()
    finally:
        await out.aclose()


async def test_session_source_logs_in_the_callers_transaction(
    db: Database, settings: Settings, dispatcher: PolicyDispatcher, repo: Repository
) -> None:
    with receiver() as r:
        await policy_endpoint(db, settings, repo, r.url)
        with pytest.raises(RuntimeError):
            async with db.session(write=True) as s:
                await dispatcher.dispatch(s, "pre_tool_use", repo=RepoRef.of(repo), task_meta=META, data=TOOL)
                raise RuntimeError("the guarded action failed: roll back")
        async with db.session(write=True) as s:
            outcome = await dispatcher.dispatch(s, "pre_tool_use", repo=RepoRef.of(repo), task_meta=META, data=TOOL)
    async with db.session() as s:
        rows = (await s.execute(select(WebhookDelivery))).scalars().all()
    assert [d.wid for d in rows] == [outcome.delivery_id]
    logged = rows[0]
    assert logged.response_status == 200 and logged.result == "ok"
    headers = dict(logged.request_headers)
    assert headers["Authorization"].endswith("<signature redacted>") and headers["Forgehand-Event"] == "pre_tool_use"
    body = json.loads(logged.request_body)
    assert body["meta"]["task"]["id"] == TASK.id and body["meta"]["repository"] == "ana/demo"


async def test_rotation_with_two_secrets_needs_no_downtime(
    db: Database, settings: Settings, dispatcher: PolicyDispatcher, repo: Repository
) -> None:
    from forge.db.audit import Actor

    cfg = config(settings)
    holder: dict[str, Verifier] = {}

    def respond(seen: Seen) -> tuple[int, list[tuple[str, str]], bytes]:
        try:
            holder["v"].verify("POST", list(seen.headers.items()), seen.body)
        except Exception as exc:
            return 401, [], str(exc).encode()
        return 200, [], b""

    async def decision() -> str:
        o = await dispatcher.dispatch(None, "pre_tool_use", repo=RepoRef.of(repo), task_meta=META, data=TOOL)
        return o.results[0].result

    with receiver(respond) as r:
        hook_id, old = await policy_endpoint(db, settings, repo, r.url)
        holder["v"] = Verifier(audience=r.url, secrets=[old])
        assert await decision() == "ok"
        async with db.session(write=True) as s:
            e = await service.get_endpoint(s, repo, hook_id)
            _, new, _ = await service.rotate_generate(s, Actor.system("t"), cfg, repo, e)
        assert await decision() == "ok"  # still signed with the old secret
        holder["v"] = Verifier(audience=r.url, secrets=[old, new])  # consumer learns the new one
        assert await decision() == "ok"
        async with db.session(write=True) as s:
            await service.rotate_promote(s, Actor.system("t"), cfg, repo, await service.get_endpoint(s, repo, hook_id))
        assert await decision() == "ok"  # now signed with the new one
        holder["v"] = Verifier(audience=r.url, secrets=[new])  # consumer drops the old one
        assert await decision() == "ok"
        holder["v"] = Verifier(audience=r.url, secrets=[old])  # a consumer left behind is refused
        assert await decision() == "http_error"


async def test_reference_consumer_denies_remembers_and_redacts(
    db: Database, settings: Settings, dispatcher: PolicyDispatcher, repo: Repository
) -> None:
    out = io.StringIO()
    port = free_port()
    url = f"http://127.0.0.1:{port}/hooks"
    hook_id, secret = await policy_endpoint(
        db, settings, repo, url, events=["pre_tool_use", "user_prompt_submit", "post_tool_use"]
    )
    consumer = make_consumer(
        audience=url,
        secrets=[secret],
        issuer=settings.instance_id,
        deny_tool_pattern=r"^bash$",
        redact_prompt_pattern=r"secret-\w+",
        out=out,
    )
    server = make_server(consumer, "127.0.0.1", port)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        r = RepoRef.of(repo)
        denied = await dispatcher.dispatch(None, "pre_tool_use", repo=r, task_meta=META, data=TOOL)
        assert denied.decision == "deny" and "bash" in denied.reason
        # The same tool_use_id again (a duplicate delivery) gets the same answer, whatever it says now.
        again = await dispatcher.dispatch(
            None, "pre_tool_use", repo=r, task_meta=META, data={**TOOL, "tool_name": "read_file"}
        )
        assert again.decision == "deny"
        fresh = await dispatcher.dispatch(
            None, "pre_tool_use", repo=r, task_meta=META, data={**TOOL, "tool_use_id": "call-2", "tool_name": "ls"}
        )
        assert fresh.decision == "allow"
        redacted = await dispatcher.dispatch(
            None, "user_prompt_submit", repo=r, task_meta=META, data={"prompt": "use secret-abc123 now", "kind": "goal"}
        )
        assert redacted.decision == "allow" and redacted.input_override == {"prompt": "use [redacted] now"}
        post = await dispatcher.dispatch(
            None, "post_tool_use", repo=r, task_meta=META, data={"tool_use_id": "call-2", "tool_name": "ls"}
        )
        assert post.decision == "allow" and post.results[0].result == "ok"
    finally:
        server.shutdown()
        server.server_close()
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [(x["event"], x.get("decision"), x.get("remembered")) for x in lines[:3]] == [
        ("pre_tool_use", "deny", False),
        ("pre_tool_use", "deny", True),
        ("pre_tool_use", None, False),
    ]
    assert lines[3]["event"] == "user_prompt_submit" and lines[3]["redacted"] is True
    assert all(x["task"] == TASK.id for x in lines)
    assert hook_id
