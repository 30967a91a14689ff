"""Custom tools over REST (docs/tools.md): a repository's admins define a tool (a draft version 1),
change it (new drafts), activate, restore and switch it off, each audited; every definition rule
answered 422 with its own code; what an agent is offered (`?for=agents`, a repository tool
shadowing the instance's); and a person's decision on a call that waits for approval: exactly
once, never after its expiry. No worker and no Docker here: the runs themselves are
tests/docker/tasks/test_custom_tools.py."""

import asyncio
from datetime import timedelta
from typing import Any

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from forge.accounts import accounts, tokens
from forge.core.settings import Settings
from forge.db.audit import Actor
from forge.db.engine import Database, utcnow
from forge.db.models import AuditEvent
from tasks.core.models import Task
from tasks.core.tool_models import CustomTool, CustomToolRun, CustomToolVersion
from tests.support.task_world import World, build_task_world

pytestmark = pytest.mark.db

TOOLS = "/api/v1/repos/ana/demo/tools"
RUN_TESTS: dict[str, Any] = {
    "name": "run_tests",
    "description": "Run the test suite on files matching a pattern",
    "parameters": {
        "type": "object",
        "properties": {"pattern": {"type": "string", "maxLength": 200}},
        "required": ["pattern"],
    },
    "script": 'echo "testing $FORGEHAND_ARG_PATTERN"\n',
    "interpreter": "sh",
    "mode": "approval",
    "timeout_seconds": 60,
}


@pytest.fixture
async def world(db: Database, settings: Settings) -> World:
    return await build_task_world(db, settings)


@pytest.fixture
async def admin_headers(db: Database) -> dict[str, str]:
    async with db.session(write=True) as s:
        root = await accounts.create_user(s, Actor.system("test"), "root", "correct horse battery", is_admin=True)
        token = await tokens.create(s, Actor.system("test"), root, "t", ["admin", "repo:write", "tasks:write"], None)
    return {"Authorization": f"Bearer {token.token}"}


async def create(client: AsyncTestClient[Litestar], world: World, **kw: Any) -> dict[str, Any]:
    r = await client.post(TOOLS, json={**RUN_TESTS, **kw}, headers=world.h("ana"))
    assert r.status_code == 201, r.text
    return dict(r.json())


async def audit_actions(db: Database) -> list[str]:
    async with db.session() as s:
        rows = (await s.execute(select(AuditEvent).order_by(AuditEvent.id))).scalars()
        return [r.action for r in rows if r.action.startswith(("tool", "tool_run"))]


async def test_a_tool_is_made_changed_activated_restored_and_switched_off(
    client: AsyncTestClient[Litestar], world: World, db: Database
) -> None:
    made = await create(client, world)
    assert made["name"] == "run_tests" and made["agent_name"] == "custom_run_tests" and made["scope"] == "repository"
    assert made["repository"] == "ana/demo" and made["latest_version"] == 1 and made["active_version"] is None
    assert made["latest"]["parameters"]["additionalProperties"] is False and made["created_by"] == "ana"
    url = f"{TOOLS}/{made['id']}"

    r = await client.patch(url, json={"script": "echo v2\n"}, headers=world.h("ana"))
    assert r.status_code == 200 and r.json()["latest_version"] == 2 and r.json()["latest"]["script"] == "echo v2\n"
    assert r.json()["latest"]["parameters"] == made["latest"]["parameters"]  # what was not sent stays

    r = await client.post(url + "/activate", json={"version": 2}, headers=world.h("ana"))
    assert r.status_code == 200 and r.json()["active_version"] == 2 and r.json()["active"]["script"] == "echo v2\n"

    r = await client.post(url + "/versions/1/restore", headers=world.h("ana"))
    assert r.status_code == 201 and r.json()["latest_version"] == 3 and r.json()["active_version"] == 2
    assert r.json()["latest"]["script"] == RUN_TESTS["script"]

    versions = (await client.get(url + "/versions", headers=world.h("ana"))).json()
    assert [(v["version"], v["active"]) for v in versions] == [(1, False), (2, True), (3, False)]

    r = await client.patch(url, json={"enabled": False}, headers=world.h("ana"))
    assert r.status_code == 200 and r.json()["enabled"] is False and r.json()["latest_version"] == 3

    assert await audit_actions(db) == [
        "tool.create", "tool.version.create", "tool.activate", "tool.version.restore", "tool.disable",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("change", "code", "named"),
    [
        ({"name": "Run-Tests"}, "invalid_tool_name", "name"),
        ({"name": "bash"}, "invalid_tool_name", "bash"),
        ({"name": "custom_ask_user"}, "invalid_tool_name", "ask_user"),
        ({"name": "ask_user"}, "invalid_tool_name", "ask_user"),
        ({"mode": "auto"}, "invalid_tool_mode", "read_only"),
        ({"mode": "sometimes"}, "invalid_tool_mode", "mode"),
        ({"interpreter": "perl"}, "invalid_tool_definition", "interpreter"),
        ({"timeout_seconds": 5}, "invalid_tool_definition", "timeout_seconds"),
        ({"timeout_seconds": 1801}, "invalid_tool_definition", "timeout_seconds"),
        ({"script": "x" * (64 * 1024 + 1)}, "invalid_tool_definition", "script"),
        (
            {"parameters": {"type": "object", "properties": {"o": {"type": "object"}}}},
            "invalid_tool_schema",
            "parameters.properties.o",
        ),
        (
            {"parameters": {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1}}}},
            "invalid_tool_schema",
            "maximum",
        ),
        (
            {"parameters": {"type": "object", "properties": {"n": {"type": "integer", "minimum": "1", "maximum": 5}}}},
            "invalid_tool_schema",
            "minimum",
        ),
        (
            {"parameters": {"type": "object", "properties": {"s": {"type": "string", "pattern": ".*"}}}},
            "invalid_tool_schema",
            "pattern",
        ),
        (
            {"parameters": {"type": "object", "properties": {f"p{i}": {"type": "boolean"} for i in range(21)}}},
            "invalid_tool_schema",
            "20",
        ),
    ],
)
async def test_each_definition_rule_is_refused_with_its_own_code(
    client: AsyncTestClient[Litestar], world: World, db: Database, change: dict[str, Any], code: str, named: str
) -> None:
    r = await client.post(TOOLS, json={**RUN_TESTS, **change}, headers=world.h("ana"))
    assert r.status_code == 422, r.text
    assert r.json()["code"] == code and named in r.json()["detail"]
    async with db.session() as s:
        assert (await s.scalars(select(CustomTool))).all() == []  # nothing half-made


async def test_a_parameter_schema_with_a_duplicate_key_is_refused(
    client: AsyncTestClient[Litestar], world: World
) -> None:
    body = (
        '{"name": "dup", "script": "true", "parameters": {"type": "object", '
        '"properties": {"a": {"type": "boolean"}, "a": {"type": "string"}}}}'
    )
    r = await client.post(TOOLS, content=body, headers={**world.h("ana"), "Content-Type": "application/json"})
    assert r.status_code == 422 and r.json()["code"] == "invalid_tool_schema" and "'a'" in r.json()["detail"]


async def test_auto_mode_without_read_only_is_refused_by_the_database_too(
    client: AsyncTestClient[Litestar], world: World, db: Database
) -> None:
    made = await create(client, world)
    with pytest.raises(IntegrityError):
        async with db.session(write=True) as s:
            s.add(
                CustomToolVersion(
                    tool_id=made["id"], version=9, parameters={}, script="true", interpreter="sh", mode="auto",
                    read_only=False, timeout_seconds=60,
                )
            )  # fmt: skip


async def test_what_agents_see_merges_instance_and_repository_tools(
    client: AsyncTestClient[Litestar], world: World, admin_headers: dict[str, str]
) -> None:
    instance = await client.post("/api/v1/admin/tools", json={**RUN_TESTS, "name": "lookup"}, headers=admin_headers)
    assert instance.status_code == 201, instance.text
    other = await client.post("/api/v1/admin/tools", json={**RUN_TESTS, "name": "ticket"}, headers=admin_headers)
    for made in (instance.json(), other.json()):
        r = await client.post(f"/api/v1/admin/tools/{made['id']}/activate", json={"version": 1}, headers=admin_headers)
        assert r.status_code == 200
    own = await create(client, world, name="lookup", mode="auto", read_only=True)
    draft = await create(client, world, name="draft_only")
    assert draft["active_version"] is None
    await client.post(f"{TOOLS}/{own['id']}/activate", json={"version": 1}, headers=world.h("ana"))

    seen = (await client.get(TOOLS + "?for=agents", headers=world.h("wendy"))).json()
    assert [(t["name"], t["scope"], t["shadows_instance_tool"]) for t in seen] == [
        ("custom_lookup", "repository", True),
        ("custom_ticket", "instance", False),
    ]
    assert seen[0]["mode"] == "auto" and seen[0]["tool_id"] == own["id"]

    # the definitions are the admins'; a reader of the repository does not even see what agents get
    assert (await client.get(TOOLS, headers=world.h("wendy"))).status_code == 403
    assert (await client.post(TOOLS, json={**RUN_TESTS, "name": "x"}, headers=world.h("wendy"))).status_code == 403
    assert (await client.get(TOOLS + "?for=agents", headers=world.h("rita"))).status_code in (403, 404)
    assert (await client.get("/api/v1/admin/tools", headers=world.h("ana"))).status_code == 403


async def _waiting_run(client: AsyncTestClient[Litestar], world: World, db: Database, *, expired: bool = False) -> int:
    made = await create(client, world)
    r = await client.post(
        "/api/v1/repos/ana/demo/tasks",
        json={"goal": "Test it", "agent": "fixer", "runtime": "command", "command": "true"},
        headers=world.h("ana"),
    )
    assert r.status_code == 201, r.text
    async with db.session(write=True) as s:
        task = (await s.execute(select(Task))).scalars().one()
        row = CustomToolRun(
            tool_id=made["id"], version=1, tool_name="run_tests", repo_id=task.repo_id, task_id=task.id,
            inputs={"pattern": "$(id)"}, inputs_hash="h" * 64, state="awaiting_approval",
            expires_at=utcnow() + (timedelta(seconds=-1) if expired else timedelta(hours=1)),
        )  # fmt: skip
        s.add(row)
        await s.flush()
        return row.id


async def test_two_approvals_at_once_make_exactly_one_decision(
    client: AsyncTestClient[Litestar], world: World, db: Database
) -> None:
    run_id = await _waiting_run(client, world, db)
    url = f"/api/v1/repos/ana/demo/tool-runs/{run_id}"
    got = await asyncio.gather(
        client.post(url + "/approve", headers=world.h("wendy")),
        client.post(url + "/approve", headers=world.h("olga")),
    )
    assert sorted(r.status_code for r in got) == [200, 409], [r.text for r in got]
    read = (await client.get(url, headers=world.h("ana"))).json()
    assert read["state"] == "queued" and read["decided_by"] in ("wendy", "olga") and read["task"] == 1
    assert read["inputs"] == {"pattern": "$(id)"}
    assert (await client.post(url + "/deny", headers=world.h("ana"))).status_code == 409
    assert (await audit_actions(db)).count("tool_run.approve") == 1


async def test_an_approval_after_the_expiry_runs_nothing(
    client: AsyncTestClient[Litestar], world: World, db: Database
) -> None:
    run_id = await _waiting_run(client, world, db, expired=True)
    url = f"/api/v1/repos/ana/demo/tool-runs/{run_id}"
    r = await client.post(url + "/approve", headers=world.h("ana"))
    assert r.status_code == 409 and "expired" in r.json()["detail"]
    assert (await client.get(url, headers=world.h("ana"))).json()["state"] == "awaiting_approval"
    assert "tool_run.approve" not in await audit_actions(db)


async def test_a_reader_cannot_decide_and_runs_of_tasks_are_listed(
    client: AsyncTestClient[Litestar], world: World, db: Database
) -> None:
    run_id = await _waiting_run(client, world, db)
    url = f"/api/v1/repos/ana/demo/tool-runs/{run_id}"
    assert (await client.post(url + "/approve", headers=world.h("rita"))).status_code == 404
    async with db.session() as s:
        tool_id = (await s.scalars(select(CustomTool.id))).one()
    runs = (await client.get(f"{TOOLS}/{tool_id}/runs", headers=world.h("wendy"))).json()
    assert [r["id"] for r in runs] == [run_id] and runs[0]["state"] == "awaiting_approval"
