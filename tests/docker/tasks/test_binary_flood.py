"""A flood of binary output (`head -c 24M /dev/urandom`): the sandbox keeps the first 16 MiB the
program wrote, but stored as the transcript's JSON (a byte that is not UTF-8 as U+FFFD, three
bytes; a control byte as `\\u0001`, six) that was about twice as much: 30 MB stored and a
31.6 MB task page. The cap now bounds what is stored, and the page shows at most its own share."""

import json
from collections.abc import Iterator

import msgspec
import pytest
from sqlalchemy import text

from forge.core.settings import Settings
from forge.db.engine import Database
from tasks.core.capping import STREAM_STORE_CAP
from tasks.http.pages.timeline import PAGE_OUTPUT_BYTES
from tests.support.tasks import Env, serve_env, start, wait_state

pytestmark = [pytest.mark.docker, pytest.mark.both_databases]  # its point is what the database keeps


@pytest.fixture
def env(settings: Settings, sandbox_image: str) -> Iterator[Env]:
    yield from serve_env(settings)


async def stored_output(env: Env) -> tuple[int, int, int]:
    """Bytes of stdout payloads stored, the omitted bytes they record, and how many events."""
    db = Database(env.settings.effective_database_url)
    try:
        async with db.session() as s:
            rows = (
                await s.execute(text("SELECT payload FROM transcript_events WHERE kind = 'stdout' ORDER BY seq"))
            ).all()
    finally:
        await db.dispose()
    # PostgreSQL hands a JSONB payload back decoded: re-encoded as the app writes it (UTF-8, not
    # json.dumps's \uXXXX escapes, which would count a U+FFFD as six bytes instead of three).
    raw = [r[0] if isinstance(r[0], str) else msgspec.json.encode(r[0]).decode() for r in rows]
    omitted = sum(int(json.loads(p).get("omitted_bytes") or 0) for p in raw)
    return sum(len(p.encode()) for p in raw), omitted, len(raw)


async def test_a_binary_flood_is_stored_within_the_cap(env: Env) -> None:
    async with env.client() as c:
        await start(c, "head -c 25165824 /dev/urandom")
        done = await wait_state(c, 1, "awaiting_review", "failed", timeout=600)
        assert done["state"] == "awaiting_review", done
        stored, omitted, events = await stored_output(env)
        print(f"stored {stored} bytes of stdout in {events} events, {omitted} bytes recorded as omitted")
        assert stored <= STREAM_STORE_CAP + 100 * events  # the text within the cap, plus each event's JSON
        assert omitted > 0
        page = await c.get("/ana/demo/tasks/1", headers={"Accept": "text/html"})
        assert page.status_code == 200
        print(f"task page: {len(page.content)} bytes")
        assert len(page.content) <= PAGE_OUTPUT_BYTES * 1.5 + 512 * 1024
        assert "more output than a page shows" in page.text
