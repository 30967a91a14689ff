"""Admin > Network: an instance admin allows hosts for model endpoints and webhooks (API and page),
in force at once without a restart (saves and connections alike), audited; the operator's
variables are the floor, shown read-only; nobody else may see or change the lists."""

import html
from typing import Any

import msgspec
import pytest
from litestar.testing import AsyncTestClient
from sqlalchemy import select

from forge.app.factory import create_app
from forge.core.access import Principal
from forge.core.settings import Settings
from forge.db import allowlists
from forge.db.audit import Actor
from forge.db.engine import Database
from forge.db.models import AuditEvent
from tests.support.accounts import PASSWORD, Accounts
from tests.support.gateway import agent_client, open_channel, upstreams
from tests.support.openai_responses import ScriptedResponses, text
from tests.support.web import csrf_from, sign_in

LISTS = "/api/v1/admin/allowed-hosts"
SETTINGS = "/api/v1/repos/ana/app/task-settings"
ENDPOINT = {"anthropic_base_url": "http://127.0.0.1:18123"}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def operator(settings: Settings) -> Settings:
    return msgspec.structs.replace(settings, webhooks_allowed_hosts="10.9.9.9, hooks.internal")


@pytest.fixture
async def client(operator: Settings) -> Any:
    async with AsyncTestClient(app=create_app(operator), base_url="http://testserver.local") as c:
        yield c


async def _world(make: Accounts) -> tuple[dict[str, str], dict[str, str]]:
    """root (an instance admin) and ana (a repository admin), each with a token."""
    await make.user("root", admin=True)
    await make.user("ana")
    return bearer(await make.token("root", "admin")), bearer(await make.token("ana", "repo:write", "webhooks:admin"))


async def _actions(db: Database) -> list[tuple[str, str]]:
    async with db.session() as s:
        rows = (await s.execute(select(AuditEvent).where(AuditEvent.action.like("admin.allowed_host.%")))).scalars()
        return [(r.action, r.target) for r in rows]


async def test_an_admin_allows_a_host_and_the_refused_save_succeeds(
    client: AsyncTestClient[Any], make: Accounts, db: Database
) -> None:
    root, ana = await _world(make)
    assert (await client.post("/api/v1/user/repos", json={"name": "app"}, headers=ana)).status_code == 201
    refused = await client.put(SETTINGS, json=ENDPOINT, headers=ana)
    assert refused.status_code == 422 and refused.json()["code"] == "host_not_allowed"

    lists = {entry["name"]: entry for entry in (await client.get(LISTS, headers=root)).json()}
    assert lists["webhooks"]["floor"] == ["10.9.9.9", "hooks.internal"] and lists["webhooks"]["entries"] == []
    assert lists["model"]["setting"] == "FORGEHAND_MODEL_ALLOWED_HOSTS" and lists["model"]["floor"] == []
    r = await client.post(f"{LISTS}/model", json={"host": "127.0.0.1", "note": "the team's llama"}, headers=root)
    assert r.status_code == 201, r.text
    entry = r.json()
    assert (entry["host"], entry["note"], entry["added_by"]) == ("127.0.0.1", "the team's llama", "root")

    # The same server, no restart: the save that was refused goes through.
    assert (await client.put(SETTINGS, json=ENDPOINT, headers=ana)).status_code == 200
    # Model hosts are not webhook hosts.
    hook = {"url": "http://127.0.0.1:18125/policy", "kind": "policy", "events": ["pre_tool_use"]}
    r = await client.post("/api/v1/repos/ana/app/hooks", json=hook, headers=ana)
    assert r.status_code == 422 and r.json()["code"] == "host_not_allowed"
    assert (await client.post(f"{LISTS}/webhooks", json={"host": "127.0.0.1"}, headers=root)).status_code == 201
    assert (await client.post("/api/v1/repos/ana/app/hooks", json=hook, headers=ana)).status_code == 201

    r = await client.delete(f"{LISTS}/model/{entry['id']}", headers=root)
    assert r.status_code == 204, r.text
    assert (await client.put(SETTINGS, json=ENDPOINT, headers=ana)).status_code == 422
    assert await _actions(db) == [
        ("admin.allowed_host.add", "model:127.0.0.1"),
        ("admin.allowed_host.add", "webhooks:127.0.0.1"),
        ("admin.allowed_host.remove", "model:127.0.0.1"),
    ]


async def test_entries_are_checked(client: AsyncTestClient[Any], make: Accounts) -> None:
    root, _ = await _world(make)
    for body, status, code in (
        ({"host": "127.0.0.1:18123"}, 422, "invalid_allowed_host"),
        ({"host": "not a host"}, 422, "invalid_allowed_host"),
        ({"host": "http://127.0.0.1/"}, 422, "invalid_allowed_host"),
        ({"host": ""}, 422, "validation_failed"),
        ({"host": "x", "colour": 1}, 422, "validation_failed"),
    ):
        r = await client.post(f"{LISTS}/model", json=body, headers=root)
        assert (r.status_code, r.json()["code"]) == (status, code), (body, r.text)
    r = await client.post(f"{LISTS}/model", json={"host": "127.0.0.1:18123"}, headers=root)
    assert "allow 127.0.0.1 (every port of that host)" in r.json()["detail"]
    assert (await client.post(f"{LISTS}/model", json={"host": "[::1]"}, headers=root)).json()["host"] == "::1"
    assert (await client.post(f"{LISTS}/model", json={"host": "LLM.Internal."}, headers=root)).json()["host"] == (
        "llm.internal"
    )
    assert (await client.post(f"{LISTS}/model", json={"host": "10.0.0.0/8"}, headers=root)).status_code == 201
    r = await client.post(f"{LISTS}/model", json={"host": "llm.internal"}, headers=root)
    assert (r.status_code, r.json()["code"]) == (409, "allowed_host_exists")
    r = await client.post(f"{LISTS}/egress", json={"host": "x.example"}, headers=root)
    assert (r.status_code, r.json()["code"]) == (404, "unknown_allow_list")
    r = await client.delete(f"{LISTS}/webhooks/1", headers=root)  # entry 1 is on the model list
    assert (r.status_code, r.json()["code"]) == (404, "allowed_host_not_found")


async def test_only_instance_admins_see_or_change_the_lists(client: AsyncTestClient[Any], make: Accounts) -> None:
    root, ana = await _world(make)
    entry = (await client.post(f"{LISTS}/model", json={"host": "127.0.0.1"}, headers=root)).json()
    narrow = bearer(await make.token("root", "repo:write"))  # an admin's token without the admin scope
    for headers in (ana, narrow):
        assert (await client.get(LISTS, headers=headers)).status_code == 403
        assert (await client.post(f"{LISTS}/model", json={"host": "10.0.0.1"}, headers=headers)).status_code == 403
        assert (await client.delete(f"{LISTS}/model/{entry['id']}", headers=headers)).status_code == 403
    assert (await client.get(LISTS)).status_code == 401
    # The page and its forms likewise.
    assert (await sign_in(client, "ana", PASSWORD)).status_code in (302, 303)
    token = csrf_from((await client.get("/settings/model-keys/")).text)
    assert (await client.get("/admin/network/")).status_code in (403, 404)
    r = await client.post("/admin/network/model", data={"csrf_token": token, "host": "10.0.0.1"})
    assert r.status_code in (403, 404)
    r = await client.post(f"/admin/network/model/{entry['id']}/remove", data={"csrf_token": token})
    assert r.status_code in (403, 404)
    lists = {e["name"]: e for e in (await client.get(LISTS, headers=root)).json()}
    assert [e["host"] for e in lists["model"]["entries"]] == ["127.0.0.1"]


async def test_the_network_page(client: AsyncTestClient[Any], make: Accounts, db: Database) -> None:
    await _world(make)
    assert (await sign_in(client, "root", PASSWORD)).status_code in (302, 303)
    page = await client.get("/admin/network/")
    assert page.status_code == 200
    text_ = html.unescape(page.text)
    assert 'href="/admin/network/" aria-current="page"' in page.text  # the admin area's nav names it
    assert "hooks.internal" in text_ and "from FORGEHAND_WEBHOOKS_ALLOWED_HOSTS (read-only" in _plain(text_)
    token = csrf_from(page.text)
    # A typo: refused next to its field, what was typed kept.
    form = {"csrf_token": token, "host": "127.0.0.1:18123", "note": "local llama"}
    r = await client.post("/admin/network/model", data=form)
    assert r.status_code == 422
    card = html.unescape(r.text[r.text.index('id="allow-model"') : r.text.index('id="allow-webhooks"')])
    assert 'role="alert"' in card and "allow 127.0.0.1 (every port of that host)" in card
    assert 'value="127.0.0.1:18123"' in card and 'value="local llama"' in card
    r = await client.post("/admin/network/model", data={**form, "host": "127.0.0.1"}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/admin/network/#allow-model"
    page = await client.get("/admin/network/")
    card = page.text[page.text.index('id="allow-model"') : page.text.index('id="allow-webhooks"')]
    assert "127.0.0.1" in card and "local llama" in card and "root" in card
    entry_id = (await _rows(db))[0]
    r = await client.post(f"/admin/network/model/{entry_id}/remove", data={"csrf_token": token}, follow_redirects=False)
    assert r.status_code == 303
    assert await _actions(db) == [
        ("admin.allowed_host.add", "model:127.0.0.1"),
        ("admin.allowed_host.remove", "model:127.0.0.1"),
    ]


def _plain(text_: str) -> str:
    return " ".join(text_.replace("<code>", "").replace("</code>", "").split())


async def _rows(db: Database) -> list[int]:
    async with db.session() as s:
        return [e.id for e in (await allowlists.read(s, Settings(), "model")).entries]


async def test_a_run_s_gateway_sees_the_change_without_a_restart(
    operator: Settings, make: Accounts, db: Database
) -> None:
    """The guard asks the list at every connection: allowed while the run's channel is open, the
    next call reaches the endpoint (the list is cached, but a change committed in this process is
    seen at once)."""
    root = await make.user("root", admin=True)
    admin = Actor(principal=Principal(account_id=root.id, login="root", type="User", is_admin=True, via="session"))
    source = allowlists.AllowListSource(db, "model", allowlists.floor(operator, "model"), ttl=3600)
    request = {"model": "scripted", "input": "hi"}
    with ScriptedResponses([text("through")], repeat_last=True) as api:
        ups = upstreams(openai_url=api.url, guarded=True)
        async with open_channel(ups, allowed_hosts=source) as ch, agent_client(ch) as c:
            h = {"authorization": f"Bearer {ch.token}"}
            refused = await c.post("/v1/responses", json=request, headers=h)
            assert refused.headers["x-forgehand-gateway"] == "refused" and api.calls == []
            async with db.session(write=True) as s:
                await allowlists.add(s, operator, admin, "model", allowlists.AllowedHostCreate(host="127.0.0.1"))
            assert (await c.post("/v1/responses", json=request, headers=h)).status_code == 200
            assert len(api.calls) == 1
