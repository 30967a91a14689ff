"""Wake-ups between processes (forge/db/wakeups.py): on PostgreSQL, what one process publishes
reaches the others through `LISTEN/NOTIFY` (never itself), gathered per loop turn; a listener
whose connection is cut listens again, and one sent a malformed payload goes on; on SQLite
nothing leaves the process."""

import asyncio

import asyncpg
import pytest

from forge.db.wakeups import PgNotifyBackend, asyncpg_dsn, for_database
from tests.support.waiting import until

pytestmark = pytest.mark.db


class Heard:
    def __init__(self) -> None:
        self.ids: list[int] = []
        self.event = asyncio.Event()

    def __call__(self, ids: list[int]) -> None:
        self.ids.extend(ids)
        self.event.set()

    async def next(self) -> list[int]:
        async with asyncio.timeout(10):
            await self.event.wait()
        self.event.clear()
        got, self.ids = self.ids, []
        return got


async def test_wakeups_cross_processes_on_postgresql_only(db_url: str) -> None:
    if db_url.startswith("sqlite"):
        assert for_database(db_url, Heard()) is None  # one process: the hub wakes its own readers
        return
    here, there = Heard(), Heard()
    a, b = for_database(db_url, here), for_database(db_url, there)
    assert a is not None and b is not None
    await a.start()
    await b.start()
    try:
        for side in (a, b):
            assert isinstance(side.backend, PgNotifyBackend)
            async with asyncio.timeout(10):
                await side.backend.listening.wait()
        for task_id in (7, 3, 7):  # one loop turn: one message, each id once
            a.publish(task_id)
        assert sorted(await there.next()) == [3, 7]
        b.publish(11)
        assert await here.next() == [11]
        assert here.ids == [] and there.ids == []  # nobody hears itself

        # The listening connection of `b` is cut (a database restart, a proxy's idle timeout):
        # it listens again, and hears what is published afterwards.
        assert isinstance(b.backend, PgNotifyBackend)
        conn = await asyncpg.connect(asyncpg_dsn(db_url))
        try:
            await conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE query LIKE 'LISTEN%' AND pid <> pg_backend_pid() AND datname = current_database()"
            )
        finally:
            await conn.close()
        backend = b.backend
        await until(lambda: not backend.listening.is_set(), timeout=10, what="the cut listener noticed")
        async with asyncio.timeout(15):
            await backend.listening.wait()
        a.publish(42)
        assert await there.next() == [42]

        # Any role of the database may NOTIFY on the channel: what is not an id is ignored, and
        # the listener goes on.
        conn = await asyncpg.connect(asyncpg_dsn(db_url))
        try:
            await conn.execute("SELECT pg_notify('forgehand_changes', 'someone|\u00b2,5,abc,-1,99999999999999')")
            await conn.execute("SELECT pg_notify('forgehand_changes', 'no separator')")
        finally:
            await conn.close()
        assert await there.next() == [5]
        a.publish(43)
        assert await there.next() == [43]
    finally:
        await a.stop()
        await b.stop()
