"""A run's refused paths (issue 13): task JSON carries their count and the first 20, the full list
is its own paginated endpoint, in the order the snapshot reported them (real database)."""

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy import select

from forge.core.settings import Settings
from forge.db.engine import Database
from tasks.core.models import Run
from tests.support.task_world import TASKS, World, build_task_world

PATHS = 1_000


@pytest.fixture
async def world(db: Database, settings: Settings) -> World:
    return await build_task_world(db, settings)


async def test_skipped_paths_are_counted_sampled_and_paginated(
    client: AsyncTestClient[Litestar], world: World, db: Database
) -> None:
    r = await client.post(TASKS, json={"goal": "many", "agent": "fixer", "command": "true"}, headers=world.h("ana"))
    assert r.status_code == 201, r.text
    # What a snapshot reports, as settle stores it (extra keys are kept as text, never lost).
    refused = [{"path": f"out/{i:05}.bin", "reason": "limit reached", "size": i} for i in range(PATHS)]
    async with db.session(write=True) as s:
        run = (await s.execute(select(Run))).scalar_one()
        run.skipped = refused

    task = (await client.get(f"{TASKS}/1", headers=world.h("ana"))).json()
    [listed] = (await client.get(TASKS, headers=world.h("ana"))).json()
    for run_json in (task["runs"][0], listed["runs"][0]):
        assert run_json["skipped_count"] == PATHS
        assert run_json["skipped"] == [{"path": f"out/{i:05}.bin", "reason": "limit reached"} for i in range(20)]

    url = f"{TASKS}/1/runs/1/skipped"
    seen: list[str] = []
    cursor = ""
    pages = 0
    while True:
        r = await client.get(url, params={"cursor": cursor, "limit": 300}, headers=world.h("ana"))
        assert r.status_code == 200, r.text
        page = r.json()
        assert page["total"] == PATHS
        seen += [item["path"] for item in page["items"]]
        pages += 1
        if page["next_cursor"] is None:
            break
        cursor = page["next_cursor"]
    assert seen == [p["path"] for p in refused] and pages == 4

    r = await client.get(url, params={"limit": 1001}, headers=world.h("ana"))
    assert r.status_code == 422 and r.json()["code"] == "validation_failed", r.text
    assert (await client.get(url, params={"cursor": "x"}, headers=world.h("ana"))).status_code == 422
    for missing in (f"{TASKS}/1/runs/2/skipped", f"{TASKS}/1/runs/01x/skipped", f"{TASKS}/9/runs/1/skipped"):
        assert (await client.get(missing, headers=world.h("ana"))).status_code == 404, missing
    # No access to tasks, no list (the task itself is 404 below write access).
    assert (await client.get(url, headers=world.h("rita"))).status_code == 404


async def test_openapi_declares_the_skipped_endpoint(client: AsyncTestClient[Litestar]) -> None:
    schema = (await client.get("/api/schema/openapi.json")).json()
    path = "/api/v1/repos/{owner}/{name}/tasks/{number}/runs/{run}/skipped"
    assert set(schema["paths"][path]) == {"get"}
    params = {p["name"] for p in schema["paths"][path]["get"]["parameters"]}
    assert {"cursor", "limit", "run", "number"} <= params
    assert "skipped_count" in schema["components"]["schemas"]["RunRead"]["properties"]
