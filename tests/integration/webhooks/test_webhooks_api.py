"""Webhook endpoints through the real app: REST (instance and repository scope, tokens with
`webhooks:admin`), secrets shown once, rotation, ping, the delivery log and redelivery, audit rows,
and the web pages with CSRF."""

import re
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy import select
from standardwebhooks.webhooks import Webhook

import webhooks.http
from forge.accounts.accounts import get_by_login
from forge.app.factory import create_app
from forge.core.settings import Settings
from forge.db.engine import Database
from forge.db.events import EventBus
from forge.db.models import AuditEvent, Collaborator, Repository
from tests.support.accounts import PASSWORD, Accounts
from tests.support.forms import read_form
from tests.support.web import csrf_from, sign_in
from tests.support.webhooks import LOOPBACK, config, make_repo, receiver
from webhooks.core.models import WebhookEndpoint
from webhooks.core.outbound import Outbound
from webhooks.delivery.deliverer import Deliverer
from webhooks.wiring import wire

ADMIN_HOOKS = "/api/v1/admin/hooks"
REPO_HOOKS = "/api/v1/repos/ana/demo/hooks"


def _quiet(settings: Settings) -> Settings:
    fields = {f.name for f in msgspec.structs.fields(Settings)}
    changes: dict[str, Any] = {}
    if "webhooks_deliver" in fields:
        changes["webhooks_deliver"] = False  # the tests run the deliverer themselves
    if "webhooks_allowed_hosts" in fields:
        changes["webhooks_allowed_hosts"] = "127.0.0.1"
    return msgspec.structs.replace(settings, **changes) if changes else settings


@pytest.fixture
def hooks_app(settings: Settings) -> Litestar:
    settings = _quiet(settings)
    app = create_app(settings)
    if not any(getattr(r, "path", "") == ADMIN_HOOKS for r in app.routes):
        for handler in webhooks.http.ROUTE_HANDLERS:
            app.register(handler)
    app.state.webhooks = wire(EventBus(), settings, app.state.db, allow=LOOPBACK, deliver=False)
    return app


@pytest.fixture
async def hc(hooks_app: Litestar) -> AsyncIterator[AsyncTestClient[Litestar]]:
    async with AsyncTestClient(app=hooks_app, base_url="http://testserver.local") as c:
        yield c


@pytest.fixture
async def repo(make: Accounts, db: Database) -> Repository:
    await make.user("ana")
    return await make_repo(db, "ana", "demo")


@pytest.fixture
async def deliverer(db: Database, settings: Settings) -> AsyncIterator[Deliverer]:
    cfg = config(settings)
    out = Outbound(cfg.allow)
    yield Deliverer(db, cfg, out)
    await out.aclose()


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def audit_actions(db: Database) -> list[tuple[str, str, str]]:
    async with db.session() as s:
        rows = (await s.execute(select(AuditEvent).order_by(AuditEvent.id))).scalars()
        return [(r.action, r.target, r.result) for r in rows if r.action.startswith("webhook.")]


async def test_instance_endpoints_are_for_admins_and_show_the_secret_once(
    hc: AsyncTestClient[Litestar], make: Accounts, db: Database
) -> None:
    await make.user("root", admin=True)
    await make.user("ana")
    admin = bearer(await make.token("root", "admin"))
    ana = bearer(await make.token("ana", "webhooks:admin"))
    body = {"url": "http://127.0.0.1:9/hook", "kind": "notify", "events": ["task.created", "repo.pushed"]}

    refused = await hc.post(ADMIN_HOOKS, json=body, headers=ana)
    assert refused.status_code == 403
    created = await hc.post(ADMIN_HOOKS, json=body, headers=admin)
    assert created.status_code == 201, created.text
    answer = created.json()
    assert answer["secret"].startswith("whsec_") and answer["kid"] == answer["hook"]["secrets"][0]["kid"]
    hook = answer["hook"]
    assert (hook["scope"], hook["repository"], hook["events"], hook["active"]) == (
        "instance",
        None,
        ["task.created", "repo.pushed"],
        True,
    )
    listed = await hc.get(ADMIN_HOOKS, headers=admin)
    shown = await hc.get(f"{ADMIN_HOOKS}/{hook['id']}", headers=admin)
    assert listed.status_code == shown.status_code == 200
    assert "whsec_" not in listed.text and "whsec_" not in shown.text
    assert answer["secret"][6:] not in listed.text
    async with db.session() as s:
        stored = await s.get(WebhookEndpoint, hook["id"])
        assert stored is not None and answer["secret"][6:] not in stored.secret_enc  # encrypted at rest
    assert ("webhook.create", f"instance:hook:{hook['id']}", "ok") in await audit_actions(db)


async def test_repository_endpoints_follow_the_access_rule(
    hc: AsyncTestClient[Litestar], make: Accounts, db: Database, repo: Repository
) -> None:
    await make.bot("hookbot")
    owner = bearer(await make.token("ana", "webhooks:admin"))
    read_only = bearer(await make.token("ana", "repo:read"))
    bot = bearer(await make.token("hookbot", "webhooks:admin"))
    body = {"url": "http://127.0.0.1:9/hook", "kind": "policy", "events": ["pre_tool_use"], "failure_policy": "hold"}

    assert (await hc.post(REPO_HOOKS, json=body, headers=bot)).status_code == 404  # cannot see the repository
    insufficient = await hc.post(REPO_HOOKS, json=body, headers=read_only)
    assert insufficient.status_code == 403 and insufficient.json()["code"] == "insufficient_scope"
    assert (await hc.get("/api/v1/repos/ana/nope/hooks", headers=owner)).status_code == 404

    async with db.session(write=True) as s:
        hookbot = await get_by_login(s, "hookbot")
        assert hookbot is not None
        s.add(Collaborator(repo_id=repo.id, account_id=hookbot.id, role="write"))
    assert (await hc.post(REPO_HOOKS, json=body, headers=bot)).status_code == 403  # write is not enough
    async with db.session(write=True) as s:
        collab = (await s.execute(select(Collaborator))).scalar_one()
        collab.role = "admin"
    created = await hc.post(REPO_HOOKS, json=body, headers=bot)
    assert created.status_code == 201, created.text
    hook = created.json()["hook"]
    assert (hook["scope"], hook["repository"], hook["failure_policy"]) == ("repository", "ana/demo", "hold")

    # Another repository's endpoint is not reachable through this one.
    await make_repo(db, "ana", "other")
    other = await hc.post("/api/v1/repos/ana/other/hooks", json=body, headers=owner)
    assert (await hc.get(f"{REPO_HOOKS}/{other.json()['hook']['id']}", headers=owner)).status_code == 404
    assert (await hc.get(f"{ADMIN_HOOKS}/{hook['id']}", headers=owner)).status_code == 403


@pytest.mark.parametrize(
    ("change", "status", "code"),
    [
        ({"url": "http://hooks.example.com/x"}, 422, "host_not_allowed"),
        ({"url": "https://user:pw@hooks.example.com/x"}, 422, "invalid_hook_url"),
        ({"url": "https://hooks.example.com/x#frag"}, 422, "invalid_hook_url"),
        ({"url": "https://169.254.169.254/"}, 422, "host_not_allowed"),
        ({"url": "https://2130706433/"}, 422, "invalid_hook_url"),
        ({"events": ["pre_tool_use"]}, 422, "invalid_hook_events"),
        ({"events": []}, 422, "validation_failed"),
        ({"failure_policy": "open"}, 422, "invalid_failure_policy"),
        ({"kind": "sometimes"}, 422, "validation_failed"),
        ({"surprise": 1}, 422, "validation_failed"),
    ],
)
async def test_bad_endpoint_input_is_refused(
    hc: AsyncTestClient[Litestar], make: Accounts, repo: Repository, change: dict[str, Any], status: int, code: str
) -> None:
    owner = bearer(await make.token("ana", "webhooks:admin"))
    body = {"url": "https://hooks.example.com/in", "kind": "notify", "events": ["task.created"], **change}
    r = await hc.post(REPO_HOOKS, json=body, headers=owner)
    assert (r.status_code, r.json()["code"]) == (status, code), r.text


async def test_update_rotate_and_delete(
    hc: AsyncTestClient[Litestar], make: Accounts, db: Database, repo: Repository
) -> None:
    owner = bearer(await make.token("ana", "webhooks:admin"))
    created = (
        await hc.post(
            REPO_HOOKS,
            json={"url": "https://hooks.example.com/in", "kind": "notify", "events": ["task.created"]},
            headers=owner,
        )
    ).json()
    hid, first_kid = created["hook"]["id"], created["kid"]
    patched = await hc.patch(
        f"{REPO_HOOKS}/{hid}", json={"events": ["repo.pushed", "task.merged"], "active": False}, headers=owner
    )
    assert patched.status_code == 200
    assert patched.json()["events"] == ["task.merged", "repo.pushed"] and patched.json()["active"] is False

    rotated = await hc.post(f"{REPO_HOOKS}/{hid}/rotate", headers=owner)
    assert rotated.status_code == 200 and rotated.json()["secret"] != created["secret"]
    assert [(s["kid"], s["role"]) for s in rotated.json()["hook"]["secrets"]] == [
        (first_kid, "current"),
        (rotated.json()["kid"], "next"),
    ]
    again = await hc.post(f"{REPO_HOOKS}/{hid}/rotate", headers=owner)
    assert (again.status_code, again.json()["code"]) == (409, "rotation_in_progress")
    promoted = await hc.post(f"{REPO_HOOKS}/{hid}/rotate/promote", headers=owner)
    assert [(s["kid"], s["role"]) for s in promoted.json()["secrets"]] == [
        (rotated.json()["kid"], "current"),
        (first_kid, "previous"),
    ]
    retired = await hc.post(f"{REPO_HOOKS}/{hid}/rotate/retire", headers=owner)
    assert [s["role"] for s in retired.json()["secrets"]] == ["current"]
    assert (await hc.post(f"{REPO_HOOKS}/{hid}/rotate/retire", headers=owner)).status_code == 409

    assert (await hc.delete(f"{REPO_HOOKS}/{hid}", headers=owner)).status_code == 204
    assert (await hc.get(f"{REPO_HOOKS}/{hid}", headers=owner)).status_code == 404
    target = f"ana/demo:hook:{hid}"
    assert [a for a, t, _ in await audit_actions(db) if t == target] == [
        "webhook.create",
        "webhook.update",
        "webhook.rotate",
        "webhook.rotate",
        "webhook.rotate",
        "webhook.delete",
    ]


async def test_ping_log_and_redeliver_with_the_same_webhook_id(
    hc: AsyncTestClient[Litestar], make: Accounts, db: Database, repo: Repository, deliverer: Deliverer
) -> None:
    owner = bearer(await make.token("ana", "webhooks:admin"))
    with receiver(lambda s: (202, [("X-Consumer", "ok")], b'{"thanks":true}')) as r:
        created = (
            await hc.post(REPO_HOOKS, json={"url": r.url, "kind": "notify", "events": ["task.created"]}, headers=owner)
        ).json()
        hid = created["hook"]["id"]
        queued = await hc.post(f"{REPO_HOOKS}/{hid}/ping", headers=owner)
        assert queued.status_code == 202 and queued.json()["event"] == "ping"
        wid = queued.json()["delivery_id"]
        assert await deliverer.run_once() == 1
        log = (await hc.get(f"{REPO_HOOKS}/{hid}/deliveries", headers=owner)).json()
        assert [(d["wid"], d["event"], d["result"], d["response_status"]) for d in log] == [(wid, "ping", "ok", 202)]
        detail = (await hc.get(f"{REPO_HOOKS}/{hid}/deliveries/{log[0]['id']}", headers=owner)).json()
        assert ["webhook-id", wid] in detail["request_headers"] and detail["response_body"] == '{"thanks":true}'
        assert ["X-Consumer", "ok"] in detail["response_headers"] and '"type":"ping"' in detail["request_body"]

        again = await hc.post(f"{REPO_HOOKS}/{hid}/deliveries/{log[0]['id']}/redeliver", headers=owner)
        assert again.status_code == 202 and again.json()["delivery_id"] == wid
        assert await deliverer.run_once() == 1
        assert (await hc.get(f"{REPO_HOOKS}/{hid}/deliveries/999999", headers=owner)).status_code == 404
    assert [s.headers["webhook-id"] for s in r.seen] == [wid, wid] and r.seen[0].body == r.seen[1].body
    for s in r.seen:
        Webhook(created["secret"]).verify(s.body, s.headers)
    log = (await hc.get(f"{REPO_HOOKS}/{hid}/deliveries", headers=owner)).json()
    assert len(log) == 2 and {d["wid"] for d in log} == {wid} and log[0]["jti"] != log[1]["jti"]
    actions = [a for a, _, _ in await audit_actions(db)]
    assert "webhook.ping" in actions and "webhook.redeliver" in actions


async def test_web_pages_create_show_secret_once_ping_and_notice(
    hc: AsyncTestClient[Litestar], make: Accounts, db: Database, repo: Repository, deliverer: Deliverer
) -> None:
    assert (await sign_in(hc, "ana", PASSWORD)).status_code == 303
    base = "/ana/demo/settings/hooks"
    page = await hc.get(base)
    assert page.status_code == 200 and "No endpoints yet" in page.text
    with receiver() as r:
        form = {
            "url": r.url,
            "kind": "notify",
            "events": ["task.created", "ping"],
            "failure_policy": "closed",
            "csrf_token": csrf_from(page.text),
        }
        missing_csrf = await hc.post(base + "/", data={k: v for k, v in form.items() if k != "csrf_token"})
        assert missing_csrf.status_code == 403
        created = await hc.post(base + "/", data=form)
        assert created.status_code == 200
        secret = re.search(r'id="new-secret">(whsec_[^<]+)<', created.text)
        assert secret, created.text
        async with db.session() as s:
            hid = (await s.execute(select(WebhookEndpoint.id))).scalar_one()
        detail = await hc.get(f"{base}/{hid}")
        assert secret.group(1) not in detail.text and "new-secret" not in detail.text

        pinged = await hc.post(
            f"{base}/{hid}/ping", data={"csrf_token": csrf_from(detail.text)}, follow_redirects=False
        )
        assert pinged.status_code == 303 and pinged.headers["location"].startswith(f"{base}/{hid}?queued=")
        assert await deliverer.run_once() == 1
        detail = await hc.get(f"{base}/{hid}")
        assert "Recent deliveries" in detail.text and ">ping<" in detail.text and ">ok" in detail.text
        delivery_id = re.search(rf'{base}/{hid}/deliveries/(\d+)"', detail.text)
        assert delivery_id
        shown = await hc.get(f"{base}/{hid}/deliveries/{delivery_id.group(1)}")
        assert "Redeliver" in shown.text and "webhook-id:" in shown.text and "HTTP 200" in shown.text
    Webhook(secret.group(1)).verify(r.seen[0].body, r.seen[0].headers)

    async with db.session(write=True) as s:
        e = await s.get(WebhookEndpoint, hid)
        assert e is not None
        e.active, e.disabled_reason = False, "disabled on 2026-11-29: the endpoint answered 410 Gone"
    listing = await hc.get(base)
    assert "was disabled by forgehand" in listing.text and "410 Gone" in listing.text
    assert 'id="disabled-notice"' in (await hc.get(f"{base}/{hid}")).text

    # Someone without the admin role on the repository sees nothing.
    await make.user("eve")
    await sign_in(hc, "eve", PASSWORD)  # same client (the app's engine belongs to its loop): now eve
    assert (await hc.get("/api/v1/user")).json()["login"] == "eve"
    assert (await hc.get(base)).status_code == 404
    assert (await hc.get("/admin/hooks")).status_code == 403


async def test_refused_hook_forms_come_back_as_typed_with_the_error_at_its_field(
    hc: AsyncTestClient[Litestar], make: Accounts, repo: Repository
) -> None:
    assert (await sign_in(hc, "ana", PASSWORD)).status_code == 303
    base = "/ana/demo/settings/hooks"
    page = await hc.get(base)
    typed = {
        "url": "http://hooks.example.com/x",
        "kind": "policy",
        "events": ["pre_tool_use", "pre_merge"],
        "failure_policy": "hold",
        "csrf_token": csrf_from(page.text),
    }
    bad = await hc.post(base + "/", data=typed)
    assert bad.status_code == 422, bad.text
    form = read_form(bad.text)
    assert form["url"].attrs.get("aria-invalid") == "true" and "must be https" in form.error_of("url")
    assert form.value("url") == "http://hooks.example.com/x"
    assert form.value("kind") == "policy" and form.value("failure_policy") == "hold"
    assert {("events", "pre_tool_use"), ("events", "pre_merge")} <= form.checked
    none = await hc.post(base + "/", data={**typed, "url": "https://hooks.example.com/x", "events": []})
    assert none.status_code == 422
    assert "choose at least one event" in read_form(none.text)["events-error"].text
    created = await hc.post(base + "/", data={**typed, "url": "https://hooks.example.com/x"})
    assert created.status_code == 200 and "whsec_" in created.text

    # The edit form: a refused save keeps what was typed there, not what is stored.
    edit = {
        "url": "ftp://elsewhere",
        "events": ["pre_merge"],
        "failure_policy": "open",
        "csrf_token": csrf_from(created.text),
    }
    r = await hc.post(f"{base}/1/edit", data=edit)
    assert r.status_code == 422, r.text
    form = read_form(r.text)
    assert form.value("url") == "ftp://elsewhere" and form.error_of("url")
    assert form.value("failure_policy") == "open" and ("events", "pre_tool_use") not in form.checked
    assert ("active", "1") not in form.checked  # unticked, as sent


async def test_admin_pages(hc: AsyncTestClient[Litestar], make: Accounts) -> None:
    await make.user("root", admin=True)
    await sign_in(hc, "root", PASSWORD)
    page = await hc.get("/admin/hooks")
    assert page.status_code == 200 and "Webhooks of this instance" in page.text
    bad = await hc.post(
        "/admin/hooks/",
        data={
            "url": "http://hooks.example.com/",
            "kind": "notify",
            "events": "task.created",
            "csrf_token": csrf_from(page.text),
        },
    )
    assert bad.status_code == 422 and "must be https" in bad.text
    ok = await hc.post(
        "/admin/hooks/",
        data={
            "url": "https://hooks.example.com/",
            "kind": "policy",
            "events": "pre_tool_use",
            "failure_policy": "open",
            "csrf_token": csrf_from(page.text),
        },
    )
    assert ok.status_code == 200 and "whsec_" in ok.text
    rotated = await hc.post("/admin/hooks/1/rotate/generate", data={"csrf_token": csrf_from(ok.text)})
    assert rotated.status_code == 200 and "Next secret staged" in rotated.text


async def test_anonymous_visitors_are_sent_to_sign_in_before_any_access_check(
    hc: AsyncTestClient[Litestar], make: Accounts, db: Database, repo: Repository
) -> None:
    # The pages ask for a session first (even where the repository would answer 404); the REST
    # API answers what the access rule says. A refusal leaves no transaction open behind it:
    # the write that follows at once goes through.
    for path in ("/ana/demo/settings/hooks", "/admin/hooks", "/nobody/nothing/settings/hooks"):
        page = await hc.get(path, follow_redirects=False)
        assert page.status_code == 401, (path, page.status_code)
    assert (await hc.get(REPO_HOOKS)).status_code == 404
    assert (await hc.post(f"{REPO_HOOKS}/1/ping")).status_code == 404
    owner = bearer(await make.token("ana", "webhooks:admin"))
    body = {"url": "http://127.0.0.1:9/hook", "kind": "notify", "events": ["task.created"]}
    assert (await hc.post(REPO_HOOKS, json=body, headers=owner)).status_code == 201


async def test_the_scope_is_authorized_before_the_body_is_validated(
    hc: AsyncTestClient[Litestar], make: Accounts, repo: Repository
) -> None:
    # The scope dependency answers first: who may not manage the scope learns nothing from the
    # body's validation; who may gets the validation error.
    await make.user("eve")
    eve = bearer(await make.token("eve", "webhooks:admin"))
    ana = bearer(await make.token("ana", "webhooks:admin"))
    invalid = {"url": 5}
    assert (await hc.post(ADMIN_HOOKS, json=invalid, headers=eve)).status_code == 403
    assert (await hc.post(REPO_HOOKS, json=invalid, headers=eve)).status_code == 404
    assert (await hc.post(REPO_HOOKS, json=invalid, headers=ana)).status_code == 422
    assert (await hc.patch(f"{REPO_HOOKS}/1", json={"nope": 1}, headers=eve)).status_code == 404
