"""A claude-code run whose model endpoint the gateway refuses fails once, with forgehand's own
reason: the real CLI (2.1.332) in the agents image is answered with a status it does not retry,
so one call is refused (not five, nor three as with a 400, which it sends again without a beta
each time), nothing reaches the endpoint, and the task's error is the
gateway's reason and its fix, typed `model_endpoint_refused`, not the CLI's "API Error" wrapper.

The endpoint was saved while an instance admin allowed its host; the admin then removed it
(Admin > Network), which is how a saved endpoint comes to be refused at run time (a name that
resolves to a private address is the other way)."""

from typing import Any

import httpx
import msgspec
import pytest

from forge.accounts import accounts, tokens
from forge.core.settings import Settings
from forge.db.audit import Actor
from forge.db.engine import Database
from tests.support.agent_box import on_served, settled
from tests.support.anthropic import ScriptedAnthropic, text
from tests.support.tasks import task_settings

pytestmark = pytest.mark.docker

KEY = "sk-ant-repository-key-0123456789"
LISTS = "/api/v1/admin/allowed-hosts"


async def _admin_token(settings: Settings) -> str:
    db = Database(settings.effective_database_url)
    try:
        async with db.session(write=True) as s:
            root = await accounts.create_user(s, Actor.system("test"), "root", "correct horse battery", is_admin=True)
            return (await tokens.create(s, Actor.system("test"), root, "admin", ["admin"], None)).token
    finally:
        await db.dispose()


async def test_a_refused_endpoint_fails_the_run_once_with_forgehand_s_reason(
    settings: Settings, agents_image: str
) -> None:
    # Nothing on the operator's list: only what an admin allows.
    s = msgspec.structs.replace(task_settings(settings), model_allowed_hosts="")
    with ScriptedAnthropic([text("never asked")], repeat_last=True) as api:

        async def drive(c: httpx.AsyncClient) -> tuple[dict[str, Any], list[dict[str, Any]]]:
            root = {"Authorization": f"Bearer {await _admin_token(s)}"}
            allowed = await c.post(f"{LISTS}/model", json={"host": "127.0.0.1"}, headers=root)
            assert allowed.status_code == 201, allowed.text
            endpoint = {"anthropic_base_url": api.url, "anthropic_api_key": KEY, "anthropic_model": "claude-test"}
            saved = await c.put("/api/v1/repos/ana/demo/task-settings", json=endpoint)
            assert saved.status_code == 200, saved.text
            removed = await c.delete(f"{LISTS}/model/{allowed.json()['id']}", headers=root)
            assert removed.status_code == 204, removed.text
            return await settled(c, "claude-code", "say hello")

        (done, events), _ = await on_served(s, drive)
    assert done["state"] == "failed", done
    assert done["failure_reason"] == "model_endpoint_refused", done
    error = done["error"]
    assert error.startswith(f"forgehand refused the model endpoint {api.url}: 127.0.0.1 is not a public address"), error
    assert "ask an instance admin to allow 127.0.0.1 in Admin > Network (model endpoints)" in error
    assert "API Error" not in error and "server-side issue" not in error.lower()
    assert [(r["state"], r["failure_reason"]) for r in done["runs"]] == [("failed", "model_endpoint_refused")]
    # One call, refused: the CLI did not retry it, and nothing reached the endpoint.
    calls = [e["payload"] for e in events if e["kind"] == "model_call"]
    assert [c["status"] for c in calls] == [403], calls
    assert api.requests == []
