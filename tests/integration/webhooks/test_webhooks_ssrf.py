"""SSRF: with no allow-list, no spelling of a non-global address, no name resolving to one, and no
redirect reaches the canary listener on 127.0.0.1; the connection goes to the checked address."""

import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import select

from forge.core.settings import Settings
from forge.core.urlguard import AllowList, validate_url
from forge.db.engine import Database
from forge.db.events import AccountRef, TaskRef
from tests.support.webhooks import Canary, config, make_repo, receiver
from webhooks.core.envelope import RepoRef, TaskMeta
from webhooks.core.models import WebhookDelivery, WebhookEndpoint
from webhooks.core.outbound import Outbound, OutboundError
from webhooks.delivery.deliverer import Deliverer
from webhooks.delivery.outbox import enqueue
from webhooks.policy.dispatcher import PolicyDispatcher

# A post to a local receiver takes milliseconds; 2 s once ran out on a loaded 2-CPU runner. What
# these tests check (refused, not followed, the checked address) does not depend on the deadline.
PATIENCE = 10.0


@pytest.fixture
def canary() -> Iterator[Canary]:
    c = Canary()
    yield c
    c.close()


def spellings(port: int) -> list[str]:
    hosts = [
        "127.0.0.1",
        "localhost",
        "2130706433",
        "0177.0.0.1",
        "0x7f.0.0.1",
        "0x7f000001",
        "127.1",
        "017700000001",
        "[::ffff:127.0.0.1]",
        "[::ffff:7f00:1]",
        "[::1]",
        "[0:0:0:0:0:ffff:127.0.0.1]",
    ]
    return [f"{scheme}://{h}:{port}/hook" for h in hosts for scheme in ("http", "https")]


async def test_every_spelling_is_refused_at_configuration_and_at_connection(canary: Canary) -> None:
    out = Outbound(AllowList())
    try:
        for url in spellings(canary.port):
            with pytest.raises(Exception, match=r"not|non-canonical|https|IPv4|loopback"):
                validate_url(url, AllowList())
            with pytest.raises(OutboundError) as info:
                await out.post(url, [], b"{}", total_timeout=PATIENCE, max_response=1024)
            assert info.value.kind == "refused", (url, info.value.detail)
    finally:
        await out.aclose()
    assert canary.accepted == 0


async def test_metadata_private_and_mapped_addresses_are_refused_without_connecting() -> None:
    out = Outbound(AllowList())
    try:
        for url in (
            "https://169.254.169.254/latest/meta-data/",
            "https://10.0.0.1/",
            "https://100.100.100.200/",
            "https://[fd00:ec2::254]/",
            "https://[64:ff9b::a9fe:a9fe]/",
            "https://[2002:a9fe:a9fe::1]/",
            "https://[::ffff:169.254.169.254]/",
        ):
            with pytest.raises(OutboundError) as info:
                await out.post(url, [], b"{}", total_timeout=PATIENCE, max_response=1024)
            assert info.value.kind == "refused", url
    finally:
        await out.aclose()


async def test_a_name_resolving_to_loopback_is_refused(canary: Canary) -> None:
    lookups: list[str] = []

    async def resolver(host: str, port: int) -> list[str]:
        lookups.append(host)
        return {"evil.example.test": ["127.0.0.1"], "mixed.example.test": ["93.184.215.14", "127.0.0.1"]}[host]

    out = Outbound(AllowList(), resolver=resolver)
    try:
        for host in ("evil.example.test", "mixed.example.test"):
            with pytest.raises(OutboundError) as info:
                await out.post(f"https://{host}:{canary.port}/x", [], b"{}", total_timeout=PATIENCE, max_response=1024)
            assert info.value.kind == "refused" and "127.0.0.1" in info.value.detail
    finally:
        await out.aclose()
    assert lookups == ["evil.example.test", "mixed.example.test"] and canary.accepted == 0


async def test_redirect_to_loopback_is_not_followed(canary: Canary) -> None:
    location = f"http://127.0.0.1:{canary.port}/internal"
    with receiver(lambda s: (302, [("Location", location)], b""), host="127.0.0.2") as redirector:
        out = Outbound(AllowList.parse("127.0.0.2"))
        try:
            reply = await out.post(redirector.url, [], b"{}", total_timeout=PATIENCE, max_response=1024)
        finally:
            await out.aclose()
    assert reply.status == 302 and len(redirector.seen) == 1
    assert canary.accepted == 0


async def test_connection_goes_to_the_checked_address_with_the_original_host() -> None:
    answers = iter([["127.0.0.1"], ["10.9.9.9"]])  # a rebinding resolver: the second answer would be refused
    lookups = []

    async def rebinding(host: str, port: int) -> list[str]:
        lookups.append(host)
        return next(answers)

    with receiver() as r:
        out = Outbound(AllowList.parse("127.0.0.0/8"), resolver=rebinding)
        try:
            url = f"http://hooks.example.test:{r.port}/in"
            first = await out.post(url, [], b"{}", total_timeout=PATIENCE, max_response=1024)
            second = await out.post(
                url, [], b"{}", total_timeout=PATIENCE, max_response=1024
            )  # reuses the checked connection
        finally:
            await out.aclose()
    assert first.status == second.status == 200
    assert [s.headers["host"] for s in r.seen] == [f"hooks.example.test:{r.port}"] * 2
    assert lookups == ["hooks.example.test"] and r.connections == 1


async def test_dispatch_and_delivery_to_a_refused_address_reach_nothing(
    db: Database, settings: Settings, canary: Canary
) -> None:
    # Endpoints stored while loopback was allow-listed; the operator has since removed it.
    repo = await make_repo(db)
    cfg = config(settings, allow=AllowList())
    urls = [u for u in spellings(canary.port) if u.startswith("http:")]
    async with db.session(write=True) as s:
        for i, url in enumerate(urls):
            e = WebhookEndpoint(
                repo_id=repo.id,
                url=url,
                kind="policy" if i % 2 else "notify",
                events=["pre_tool_use"] if i % 2 else ["task.created"],
                failure_policy="open",  # so that every policy endpoint is tried
                secret_kid="k",
                secret_enc=cfg.box.encrypt(bytes(32).hex()),
            )
            s.add(e)
            await s.flush()
            if e.kind == "notify":
                enqueue(
                    s,
                    cfg,
                    e.id,
                    wid=str(uuid.uuid4()),
                    event_type="task.created",
                    subject="forgehand:repo:x",
                    body=b"{}",
                    order_key="k",
                    manual=False,
                )
    out = Outbound(cfg.allow)
    try:
        dispatcher = PolicyDispatcher(db, cfg, out)
        meta = TaskMeta(task=TaskRef(id=str(uuid.uuid4()), number=1), actor=AccountRef(login="ana"))
        outcome = await dispatcher.dispatch(None, "pre_tool_use", repo=RepoRef.of(repo), task_meta=meta, data={})
        assert outcome.decision == "allow" and len(outcome.results) == len(urls) // 2
        assert {r.result for r in outcome.results} == {"connection_error"}
        assert all(r.attempts == 1 for r in outcome.results)  # a refusal is not retried
        assert await Deliverer(db, cfg, out).run_once() == len(urls) // 2
    finally:
        await out.aclose()
    async with db.session() as s:
        results = (await s.execute(select(WebhookDelivery.result, WebhookDelivery.error))).all()
    assert len(results) == len(urls) and all(r == "connection_error" for r, _ in results)
    assert all(("refuse" in e or "resolves to" in e or "non-canonical" in e or "IPv4" in e) for _, e in results)
    assert canary.accepted == 0
