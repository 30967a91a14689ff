"""A personal model key names its model (API and form), the runs it pays for use it, and a task
whose runtime could not be given a model is refused when it is started (API and form: 422
`model_not_chosen`, the message naming where to set one), not by the gateway in the middle of
the run."""

import html
from pathlib import Path
from typing import Any

import msgspec
import pytest
from litestar.testing import AsyncTestClient
from sqlalchemy import select

from forge.app.factory import create_app
from forge.core.settings import Settings
from forge.db.engine import Database
from forge.db.models import Account, AuditEvent, Repository
from tasks.core.repo_settings import model_access
from tests.support.task_world import TASKS, World, build_task_world
from tests.support.web import csrf_from, sign_in

PAGE = "/ana/demo/tasks"
KEY = "sk-ant-personal-0123456789-WXYZ"
ANTHROPIC = "/api/v1/user/model-keys/anthropic"
OPENAI = "/api/v1/user/model-keys/openai"


@pytest.fixture
def priced(settings: Settings, tmp_path: Path) -> Settings:
    """An instance with an Anthropic key but no model, and a price table (the gateway then lets a
    run use only its configured model or one the table lists)."""
    prices = tmp_path / "prices.toml"
    prices.write_text('["claude-mine"]\ninput = 3.0\noutput = 15.0\n')
    return msgspec.structs.replace(
        settings, anthropic_api_key="sk-ant-instance-key-0123456789", anthropic_model="", model_prices=str(prices)
    )


@pytest.fixture
async def client(priced: Settings) -> Any:
    async with AsyncTestClient(app=create_app(priced), base_url="http://testserver.local") as c:
        yield c


@pytest.fixture
async def world(db: Database, priced: Settings) -> World:
    return await build_task_world(db, priced)


async def _as_ana(client: AsyncTestClient[Any], world: World) -> dict[str, str]:
    """ana signed in (setting a model key takes a browser session); the CSRF header REST needs."""
    assert (await sign_in(client, "ana", "correct horse battery")).status_code in (302, 303)
    r = await client.put(
        "/api/v1/repos/ana/demo/task-settings", json={"allow_personal_keys": True}, headers=world.h("ana")
    )
    assert r.status_code == 200, r.text
    return {"X-CSRF-Token": csrf_from((await client.get("/settings/model-keys/")).text)}


async def test_a_personal_key_names_its_model(
    client: AsyncTestClient[Any], world: World, db: Database, priced: Settings
) -> None:
    h = await _as_ana(client, world)
    r = await client.put(ANTHROPIC, json={"api_key": KEY, "base_url": "https://llm.example", "model": "x y"}, headers=h)
    assert r.status_code == 422 and r.json()["code"] == "invalid_model_name", r.text
    r = await client.put(
        ANTHROPIC, json={"api_key": KEY, "base_url": "https://llm.example", "model": "claude-mine"}, headers=h
    )
    assert r.status_code == 200 and r.json()["model"] == "claude-mine", r.text
    async with db.session() as s:
        repo_id = (await s.execute(select(Repository.id))).scalar_one()
        ana_id = (await s.execute(select(Account.id).where(Account.login == "ana"))).scalar_one()
        access = await model_access(s, priced, repo_id, ana_id)
        audit = (await s.execute(select(AuditEvent).where(AuditEvent.action == "user.model_key.set"))).scalars().all()
    assert (access["anthropic"].source, access["anthropic"].model) == ("personal", "claude-mine")
    assert audit[-1].detail["model"] == "claude-mine"
    # The form shows it and sets it.
    page = await client.get("/settings/model-keys/")
    assert 'id="model_anthropic"' in page.text and 'value="claude-mine"' in page.text
    form = {"csrf_token": h["X-CSRF-Token"], "api_key": KEY, "base_url": "", "model": "claude-other"}
    r = await client.post("/settings/model-keys/anthropic", data=form, follow_redirects=False)
    assert r.status_code == 303, r.text
    assert (await client.get(ANTHROPIC, headers=h)).json()["model"] == "claude-other"


async def test_a_start_without_a_model_is_refused_with_the_fix(client: AsyncTestClient[Any], world: World) -> None:
    h = await _as_ana(client, world)
    assert (
        await client.put(ANTHROPIC, json={"api_key": KEY, "base_url": "https://llm.example"}, headers=h)
    ).status_code == 200
    body = {"goal": "say hello", "agent": "fixer", "runtime": "claude-code"}
    r = await client.post(TASKS, json=body, headers=h)
    assert r.status_code == 422 and r.json()["code"] == "model_not_chosen", r.text
    detail = r.json()["detail"]
    assert detail.startswith("no model can be chosen for claude-code")
    assert "set your Anthropic key's model (Settings > Model access)" in detail
    assert "FORGEHAND_ANTHROPIC_MODEL" in detail
    # The start form says the same, the form kept.
    page = (await client.get(f"{PAGE}/")).text
    form = {"csrf_token": csrf_from(page), "goal": "say hello", "agent": "fixer", "runtime": "claude-code"}
    r = await client.post(f"{PAGE}/", data=form, follow_redirects=False)
    assert r.status_code == 422 and 'role="alert"' in r.text
    assert "set your Anthropic key's model (Settings > Model access)" in html.unescape(r.text)
    assert (await client.get(TASKS, headers=world.h("ana"))).json() == []  # nothing was started
    # With the key's model set, the same start goes through.
    model = {"api_key": KEY, "base_url": "https://llm.example", "model": "claude-mine"}
    assert (await client.put(ANTHROPIC, json=model, headers=h)).status_code == 200
    r = await client.post(f"{PAGE}/", data=form, follow_redirects=False)
    assert r.status_code == 303, r.text


async def test_the_instance_s_key_without_a_model_names_the_instance_setting(
    client: AsyncTestClient[Any], world: World
) -> None:
    r = await client.post(TASKS, json={"goal": "g", "agent": "fixer", "runtime": "claude-code"}, headers=world.h("ana"))
    assert r.status_code == 422 and r.json()["code"] == "model_not_chosen", r.text
    assert "set FORGEHAND_ANTHROPIC_MODEL (the instance's), or the repository's Anthropic model" in r.json()["detail"]
    settings = {"anthropic_model": "claude-mine"}
    assert (
        await client.put("/api/v1/repos/ana/demo/task-settings", json=settings, headers=world.h("ana"))
    ).status_code == 200
    r = await client.post(TASKS, json={"goal": "g", "agent": "fixer", "runtime": "claude-code"}, headers=world.h("ana"))
    assert r.status_code == 201, r.text


async def test_an_openai_compatible_key_without_a_model(client: AsyncTestClient[Any], world: World) -> None:
    """An OpenAI-compatible endpoint names no model by default: codex with a personal key and no
    model anywhere is refused for the model, not for a missing endpoint."""
    h = await _as_ana(client, world)
    key = {"api_key": "sk-openai-personal-0123456789", "base_url": "https://llm.example/v1"}
    assert (await client.put(OPENAI, json=key, headers=h)).status_code == 200
    r = await client.post(TASKS, json={"goal": "g", "agent": "fixer", "runtime": "codex"}, headers=h)
    assert r.status_code == 422 and r.json()["code"] == "model_not_chosen", r.text
    assert "set your OpenAI-compatible key's model (Settings > Model access)" in r.json()["detail"]
    assert (await client.put(OPENAI, json={**key, "model": "coder"}, headers=h)).status_code == 200
    r = await client.post(TASKS, json={"goal": "g", "agent": "fixer", "runtime": "codex"}, headers=h)
    assert r.status_code == 201, r.text


async def test_without_a_price_table_the_agent_s_default_passes(settings: Settings, db: Database) -> None:
    """No price table: the gateway lets the agent's own default model through, so the instance's
    key alone is enough for claude-code (nothing to refuse up front)."""
    plain = msgspec.structs.replace(settings, anthropic_api_key="sk-ant-instance-key-0123456789")
    world = await build_task_world(db, plain)
    async with AsyncTestClient(app=create_app(plain), base_url="http://testserver.local") as c:
        body = {"goal": "g", "agent": "fixer", "runtime": "claude-code"}
        r = await c.post(TASKS, json=body, headers=world.h("ana"))
    assert r.status_code == 201, r.text
