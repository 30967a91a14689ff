"""The turn to build an environment image (`tasks.run.environment.build_turn`): builds of one image
wait for each other in a process (an asyncio lock) and, on PostgreSQL, across worker processes that
share a Docker engine (an advisory lock on a connection of its own); other images and other
engines do not wait."""

import asyncio

import pytest
import sqlalchemy as sa

from forge.core.settings import Settings
from forge.db.engine import Database
from tasks.run.environment import build_turn
from tests.support.waiting import until

pytestmark = pytest.mark.db


async def test_two_processes_sharing_an_engine_build_one_image_at_a_time(settings: Settings, db: Database) -> None:
    url = settings.effective_database_url
    a_db, b_db = Database(url), Database(url)  # two processes' pools
    a_builds: dict[str, asyncio.Lock] = {}
    b_builds: dict[str, asyncio.Lock] = {}
    order: list[str] = []
    inside = asyncio.Event()
    release = asyncio.Event()

    async def first() -> None:
        async with build_turn(a_db, a_builds, "forgehand-env:x", "engine-1"):
            order.append("a in")
            inside.set()
            await release.wait()
            order.append("a out")

    async def second(builds: dict[str, asyncio.Lock], handle: Database, tag: str, engine: str, name: str) -> None:
        await inside.wait()
        async with build_turn(handle, builds, tag, engine):
            order.append(f"{name} in")

    try:
        running = asyncio.ensure_future(first())
        other_image = asyncio.ensure_future(second(b_builds, b_db, "forgehand-env:y", "engine-1", "other image"))
        other_engine = asyncio.ensure_future(second(b_builds, b_db, "forgehand-env:x", "engine-2", "other engine"))
        await asyncio.wait_for(asyncio.gather(other_image, other_engine), 30)  # neither waits for a
        other_process = asyncio.ensure_future(second(b_builds, b_db, "forgehand-env:x", "engine-1", "b"))
        postgres = db.engine.dialect.name == "postgresql"
        if postgres:  # b waits on the server for a's advisory lock
            await until(lambda: waiting_advisory_locks(db), timeout=30, what="b to wait for the lock")
        else:  # SQLite has one process: its other "process" does not wait
            await until(lambda: "b in" in order, timeout=30, what="b to go in")
        release.set()
        await asyncio.wait_for(asyncio.gather(running, other_process), 30)
    finally:
        await a_db.dispose()
        await b_db.dispose()
    assert set(order[: order.index("a out")]) >= {"a in", "other image in", "other engine in"}
    assert (order.index("a out") < order.index("b in")) is postgres


async def waiting_advisory_locks(db: Database) -> bool:
    async with db.engine.connect() as conn:
        waiting = await conn.execute(
            sa.text("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted")
        )
        return bool(waiting.scalar_one())
