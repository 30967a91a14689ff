"""How long headless Chromium takes to load and render a task page whose transcript has 2,000
events of every kind (tool cards, outputs, phases, policy decisions, markdown), server rendering
included. Reported, not asserted.

Run: `make bench` (or `pytest -q -s tests/bench/bench_transcript_browser.py -o python_files='bench_*.py'`)."""

import asyncio
import os
from pathlib import Path

import httpx
from playwright.sync_api import sync_playwright

from forge.core.settings import Settings, load_settings, prepare_data_dir
from forge.db.engine import Database
from forge.db.migrate import upgrade_async
from tests.support.task_world import TASKS, build_task_world
from tests.support.tasks import serve
from tests.support.transcripts import every_kind, record

EVENTS = 2000
ROUNDS = 5
CHROMIUM = os.environ.get("FORGEHAND_TEST_CHROMIUM", "/usr/bin/chromium")


async def _seed(settings: Settings, url: str) -> None:
    await upgrade_async(settings.effective_database_url)
    db = Database(settings.effective_database_url)
    try:
        world = await build_task_world(db, settings)
        async with httpx.AsyncClient(base_url=url, timeout=30) as c:
            body = {"goal": "bench", "agent": "fixer", "command": "true"}
            assert (await c.post(TASKS, json=body, headers=world.h("ana"))).status_code == 201
        async with db.session() as s:
            from sqlalchemy import select

            from tasks.core.models import Run

            run_id = (await s.execute(select(Run.id))).scalars().first()
        assert run_id is not None
        batch = every_kind(run_id)
        events = [batch[i % len(batch)] for i in range(EVENTS)]
        for start in range(0, EVENTS, 500):
            await record(db, 1, events[start : start + 500])
    finally:
        await db.dispose()


def test_render_a_transcript_of_2000_events(tmp_path: Path) -> None:
    settings = prepare_data_dir(
        load_settings(
            environ={},
            data_dir=tmp_path / "data",
            database_url=f"sqlite+aiosqlite:///{tmp_path / 'f.db'}",
            log_level="warning",
            run_worker=False,
            seed_demo=False,
            webhooks_deliver=False,
        )
    )
    asyncio.run(upgrade_async(settings.effective_database_url))
    for url in serve(settings):
        asyncio.run(_seed(settings, url))
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--headless", "--no-sandbox"], headless=True)
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(f"{url}/signin")
            page.get_by_label("Login", exact=True).fill("ana")
            page.get_by_label("Password", exact=True).fill("correct horse battery")
            page.get_by_role("button", name="Sign in").click()
            page.wait_for_url(url + "/")
            loads, servers = [], []
            for _ in range(ROUNDS):
                page.goto(f"{url}/ana/demo/tasks/1", wait_until="load")
                nav = page.evaluate("performance.getEntriesByType('navigation')[0].toJSON()")
                loads.append(nav["loadEventEnd"] - nav["startTime"])
                servers.append(nav["responseEnd"] - nav["requestStart"])
            shown = page.locator("#transcript .ti").count()
            size = len(page.content())
            browser.close()
        loads.sort()
        servers.sort()
        print(
            f"\ntranscript of {EVENTS} events ({shown} items, {size / 1e6:.1f} MB of HTML): "
            f"page load median {loads[ROUNDS // 2]:.0f} ms (min {loads[0]:.0f}, max {loads[-1]:.0f}); "
            f"server response median {servers[ROUNDS // 2]:.0f} ms"
        )
