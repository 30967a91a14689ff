"""Schedules over REST (repository admins): create, list, read, change, pause, delete, each audited;
what a schedule may be refused for (a cron expression, a time zone, the start's own refusals), and
who may see them. No worker: a schedule's runs are tests/integration/tasks/test_schedules_runs.py."""

from datetime import UTC, datetime
from typing import Any

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy import select

from forge.core.settings import Settings
from forge.db.engine import Database
from forge.db.models import AuditEvent
from tests.support.task_world import World, build_task_world

pytestmark = pytest.mark.db

SCHEDULES = "/api/v1/repos/ana/demo/schedules"
NIGHTLY: dict[str, Any] = {
    "name": "nightly deps",
    "cron": "0 3 * * *",
    "timezone": "Europe/Berlin",
    "goal": "Update the dependencies",
    "agent": "fixer",
    "command": "true",
}


@pytest.fixture
async def world(db: Database, settings: Settings) -> World:
    return await build_task_world(db, settings)


async def create(client: AsyncTestClient[Litestar], world: World, **kw: Any) -> dict[str, Any]:
    r = await client.post(SCHEDULES, json={**NIGHTLY, **kw}, headers=world.h("ana"))
    assert r.status_code == 201, r.text
    return dict(r.json())


async def audit_actions(db: Database) -> list[str]:
    async with db.session() as s:
        rows = (await s.execute(select(AuditEvent).order_by(AuditEvent.id))).scalars()
        return [r.action for r in rows if r.action.startswith("task.schedule.")]


async def test_create_list_read_change_and_delete(
    client: AsyncTestClient[Litestar], world: World, db: Database
) -> None:
    made = await create(client, world)
    assert made["name"] == "nightly deps" and made["cron"] == "0 3 * * *" and made["agent"] == "fixer"
    assert made["runtime"] == "command" and made["command"] == "true" and made["starter"] == "ana"
    assert made["timezone"] == "Europe/Berlin" and made["paused"] is False and made["base"] == ""
    assert made["last_run_at"] is None and made["last_task"] is None and made["last_skip_reason"] == ""
    assert made["html_url"] == f"http://testserver.local/ana/demo/settings/schedules/{made['id']}"
    next_run = datetime.fromisoformat(made["next_run_at"])
    assert next_run > datetime.now(UTC) and next_run.minute == 0 and next_run.hour in (1, 2)  # 03:00 Berlin

    listed = (await client.get(SCHEDULES, headers=world.h("ana"))).json()
    assert [s["id"] for s in listed] == [made["id"]]
    one = f"{SCHEDULES}/{made['id']}"
    assert (await client.get(one, headers=world.h("ana"))).json() == made

    r = await client.patch(one, json={"cron": "*/15 * * * *", "timezone": "UTC"}, headers=world.h("ana"))
    assert r.status_code == 200, r.text
    changed = r.json()
    assert changed["cron"] == "*/15 * * * *" and changed["goal"] == NIGHTLY["goal"]
    assert datetime.fromisoformat(changed["next_run_at"]).minute % 15 == 0

    paused = (await client.patch(one, json={"paused": True}, headers=world.h("ana"))).json()
    assert paused["paused"] is True and paused["next_run_at"] is None  # no next run while paused
    resumed = (await client.patch(one, json={"paused": False}, headers=world.h("ana"))).json()
    assert resumed["paused"] is False and resumed["next_run_at"] is not None

    r = await client.delete(one, headers=world.h("ana"))
    assert r.status_code == 204, r.text
    assert (await client.get(one, headers=world.h("ana"))).json()["code"] == "schedule_not_found"
    assert (await client.get(SCHEDULES, headers=world.h("ana"))).json() == []
    assert await audit_actions(db) == [
        "task.schedule.create",
        "task.schedule.update",
        "task.schedule.update",
        "task.schedule.update",
        "task.schedule.delete",
    ]


@pytest.mark.parametrize(
    ("cron", "why"),
    [
        ("0 3 * *", "5 fields"),
        ("0 3 * * * *", "5 fields"),
        ("61 * * * *", "out of range"),
        ("0 0 30 2 *", "failed to find next date"),
        ("@daily", "5 fields"),
    ],
)
async def test_an_invalid_cron_expression_is_422_with_the_reason(
    client: AsyncTestClient[Litestar], world: World, cron: str, why: str
) -> None:
    r = await client.post(SCHEDULES, json={**NIGHTLY, "cron": cron}, headers=world.h("ana"))
    assert r.status_code == 422, r.text
    assert r.json()["code"] == "invalid_cron" and why in r.json()["detail"]


async def test_an_unknown_time_zone_is_422(client: AsyncTestClient[Litestar], world: World) -> None:
    for zone in ("Mars/Olympus_Mons", "../../etc/passwd", "Europe/"):
        r = await client.post(SCHEDULES, json={**NIGHTLY, "timezone": zone}, headers=world.h("ana"))
        assert r.status_code == 422, r.text
        assert r.json()["code"] == "unknown_timezone"
    made = await create(client, world)
    r = await client.patch(f"{SCHEDULES}/{made['id']}", json={"timezone": "Nowhere/Town"}, headers=world.h("ana"))
    assert r.status_code == 422 and r.json()["code"] == "unknown_timezone", r.text


async def test_a_start_the_person_could_not_make_is_refused_as_the_start_refuses_it(
    client: AsyncTestClient[Litestar], world: World
) -> None:
    # rita has read access only: not a bot that may work here.
    for body, code in (
        ({"agent": "rita"}, "invalid_agent"),
        ({"agent": "nobody"}, "invalid_agent"),
        ({"command": None, "runtime": "command"}, "command_required"),
        ({"base": "no-such-branch"}, "base_not_found"),
    ):
        r = await client.post(SCHEDULES, json={**NIGHTLY, **body}, headers=world.h("ana"))
        task_start = await client.post(
            "/api/v1/repos/ana/demo/tasks",
            json={k: v for k, v in {**NIGHTLY, **body}.items() if k not in ("name", "cron", "timezone")},
            headers=world.h("ana"),
        )
        assert r.status_code == task_start.status_code == 422, (r.text, task_start.text)
        assert r.json()["code"] == task_start.json()["code"] == code
    made = await create(client, world)
    r = await client.patch(f"{SCHEDULES}/{made['id']}", json={"agent": "rita"}, headers=world.h("ana"))
    assert r.status_code == 422 and r.json()["code"] == "invalid_agent", r.text


async def test_names_are_unique_per_repository(client: AsyncTestClient[Litestar], world: World) -> None:
    await create(client, world)
    r = await client.post(SCHEDULES, json=NIGHTLY, headers=world.h("ana"))
    assert r.status_code == 409 and r.json()["code"] == "schedule_exists", r.text


async def test_only_repository_admins_see_and_change_schedules(client: AsyncTestClient[Litestar], world: World) -> None:
    made = await create(client, world)
    one = f"{SCHEDULES}/{made['id']}"
    for who, status in (("wendy", 403), ("rita", 403), ("fixer", 403)):
        assert (await client.get(SCHEDULES, headers=world.h(who))).status_code == status, who
        assert (await client.post(SCHEDULES, json=NIGHTLY, headers=world.h(who))).status_code == status, who
        assert (await client.patch(one, json={"paused": True}, headers=world.h(who))).status_code == status, who
        assert (await client.delete(one, headers=world.h(who))).status_code == status, who
    assert (await client.get(SCHEDULES)).status_code in (401, 404)
    assert (await client.get(f"{SCHEDULES}/999999", headers=world.h("ana"))).status_code == 404
