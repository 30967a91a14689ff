"""A model or webhook endpoint at a host the allow-list does not name is refused when it is saved
(API and forms: 422 `host_not_allowed`, the message naming where an instance admin allows it),
not when a run or a delivery first connects to it."""

import html
from typing import Any

import msgspec
from litestar.testing import AsyncTestClient

from forge.app.factory import create_app
from forge.core.settings import Settings
from tests.support.accounts import PASSWORD, Accounts
from tests.support.web import csrf_from, sign_in

SETTINGS = "/api/v1/repos/ana/app/task-settings"
KEY = "sk-ant-personal-0123456789-WXYZ"
MODEL_FIX = "ask an instance admin to allow 127.0.0.1 in Admin > Network (model endpoints)"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def _world(client: AsyncTestClient[Any], make: Accounts) -> dict[str, str]:
    await make.user("ana")
    ana = bearer(await make.token("ana", "repo:write", "webhooks:admin"))
    assert (await client.post("/api/v1/user/repos", json={"name": "app"}, headers=ana)).status_code == 201
    return ana


async def _signed_in(client: AsyncTestClient[Any], page: str) -> str:
    """Sign ana in; the CSRF token of `page`."""
    assert (await sign_in(client, "ana", PASSWORD)).status_code in (302, 303)
    return csrf_from((await client.get(page)).text)


async def test_repository_model_endpoints_are_checked_when_saved(client: AsyncTestClient[Any], make: Accounts) -> None:
    ana = await _world(client, make)
    for field, url, fix in (
        ("anthropic_base_url", "http://127.0.0.1:18123", MODEL_FIX),
        ("model_base_url", "http://127.0.0.1:18123/v1", MODEL_FIX),
        ("model_base_url", "https://10.0.0.5/v1", "allow 10.0.0.5 in Admin > Network (model endpoints)"),
        ("anthropic_base_url", "http://localhost:8080", "allow localhost in Admin > Network (model endpoints)"),
        ("anthropic_base_url", "http://[::1]:8080", "allow ::1 in Admin > Network (model endpoints)"),
    ):
        r = await client.put(SETTINGS, json={field: url}, headers=ana)
        assert r.status_code == 422 and r.json()["code"] == "host_not_allowed", (field, url, r.text)
        assert f"{url} cannot be a model endpoint" in r.json()["detail"] and fix in r.json()["detail"], r.text
    assert (await client.get(SETTINGS, headers=ana)).json()["anthropic_base_url"] is None  # nothing was saved
    # A public endpoint is saved as before (a name that resolves to a private address is refused
    # when the gateway connects: it cannot be told here).
    r = await client.put(SETTINGS, json={"anthropic_base_url": "https://llm.example/anthropic"}, headers=ana)
    assert r.status_code == 200, r.text


async def test_the_operator_list_and_the_instance_endpoint_pass(settings: Settings, make: Accounts) -> None:
    operator = msgspec.structs.replace(
        settings, model_allowed_hosts="127.0.0.1", anthropic_base_url="http://10.1.2.3:4000", model_base_url=""
    )
    async with AsyncTestClient(app=create_app(operator), base_url="http://testserver.local") as client:
        ana = await _world(client, make)
        body = {"anthropic_base_url": "http://127.0.0.1:18123", "model_base_url": "http://127.0.0.1:18124/v1"}
        assert (await client.put(SETTINGS, json=body, headers=ana)).status_code == 200
        # The instance's own endpoint is the operator's choice: never checked.
        r = await client.put(SETTINGS, json={"anthropic_base_url": "http://10.1.2.3:4000/"}, headers=ana)
        assert r.status_code == 200, r.text
        r = await client.put(SETTINGS, json={"model_base_url": "http://10.1.2.3:4000/v1"}, headers=ana)
        assert r.status_code == 422 and r.json()["code"] == "host_not_allowed"


async def test_the_task_settings_form_shows_the_refusal(client: AsyncTestClient[Any], make: Accounts) -> None:
    ana = await _world(client, make)
    token = await _signed_in(client, "/ana/app/settings/tasks/")
    form = {"csrf_token": token, "anthropic_base_url": "http://127.0.0.1:18123", "anthropic_model": "claude-x"}
    r = await client.post("/ana/app/settings/tasks/", data=form)
    page = html.unescape(r.text)
    assert r.status_code == 422 and 'role="alert"' in page, page
    assert "http://127.0.0.1:18123 cannot be a model endpoint" in page and MODEL_FIX in page
    assert "Saved." not in page
    assert (await client.get(SETTINGS, headers=ana)).json()["anthropic_model"] is None


async def test_personal_model_endpoints_are_checked_when_saved(client: AsyncTestClient[Any], make: Accounts) -> None:
    await _world(client, make)
    token = await _signed_in(client, "/settings/model-keys/")
    path = "/api/v1/user/model-keys/anthropic"
    headers = {"X-CSRF-Token": token}
    r = await client.put(path, json={"api_key": KEY, "base_url": "http://127.0.0.1:18123"}, headers=headers)
    assert r.status_code == 422 and r.json()["code"] == "host_not_allowed" and MODEL_FIX in r.json()["detail"]
    assert (await client.get(path, headers=headers)).json()["configured"] is False
    # The form says the same, on the page, and stores nothing.
    form = {"csrf_token": token, "api_key": KEY, "base_url": "http://127.0.0.1:18123"}
    r = await client.post("/settings/model-keys/anthropic", data=form)
    assert r.status_code == 422 and 'role="alert"' in r.text and MODEL_FIX in html.unescape(r.text), r.text
    assert (await client.get(path, headers=headers)).json()["configured"] is False
    r = await client.put(path, json={"api_key": KEY, "base_url": "https://llm.example"}, headers=headers)
    assert r.status_code == 200, r.text


async def test_webhook_endpoints_name_the_fix(client: AsyncTestClient[Any], make: Accounts) -> None:
    ana = await _world(client, make)
    fix = "ask an instance admin to allow 127.0.0.1 in Admin > Network (webhooks)"
    body = {"url": "http://127.0.0.1:18125/policy", "kind": "policy", "events": ["pre_tool_use"]}
    r = await client.post("/api/v1/repos/ana/app/hooks", json=body, headers=ana)
    assert r.status_code == 422 and r.json()["code"] == "host_not_allowed" and fix in r.json()["detail"], r.text
    token = await _signed_in(client, "/ana/app/settings/hooks/")
    form = {"csrf_token": token, "url": body["url"], "kind": "policy", "events": "pre_tool_use"}
    r = await client.post("/ana/app/settings/hooks/", data=form)
    assert r.status_code == 422 and fix in html.unescape(r.text), r.text
    assert (await client.get("/api/v1/repos/ana/app/hooks", headers=ana)).json() == []
