"""300 concurrent reads of a repository's tasks against `forgehand serve` in its own process (the
test's database: SQLite here, PostgreSQL in CI): every one answers 200 (reads never wait behind
the write path), and `/metrics` counts each answer with the status it really had."""

import asyncio
import re
import time
from collections import Counter
from collections.abc import Iterator

import httpx
import pytest

from forge.accounts import accounts, tokens
from forge.core.settings import Settings
from forge.db.audit import Actor
from forge.db.engine import Database
from tests.support.ports import free_port
from tests.support.serve_process import serving
from tests.support.tasks import seed

TASKS = "/api/v1/repos/ana/demo/tasks"
ROUTE = "/api/v1/repos/{owner}/{name}/tasks"  # as /metrics names it (grouped by route)
READS = 300


@pytest.fixture
def served(settings: Settings) -> Iterator[str]:
    port = free_port()
    with serving(settings, port, FORGEHAND_RUN_WORKER="false"):
        yield f"http://127.0.0.1:{port}"


async def counted(served: str) -> Counter[str]:
    """`forgehand_requests_total` of GET on the tasks route, by status code (a client of its own:
    the load's keep-alive connections may be closed by now)."""
    async with httpx.AsyncClient(base_url=served, timeout=60) as c:
        metrics = (await c.get("/metrics")).text
    out: Counter[str] = Counter()
    for line in metrics.splitlines():
        if line.startswith("forgehand_requests_total{") and f'path="{ROUTE}"' in line and 'method="GET"' in line:
            status = re.search(r'status_code="(\d+)"', line)
            assert status is not None, line
            out[status.group(1)] += int(float(line.rsplit(" ", 1)[1]))
    return out


@pytest.mark.serial  # 300 concurrent reads against one server: a load test, alone after the parallel pass
async def test_300_concurrent_reads_all_answer_200_and_are_counted_as_such(settings: Settings, served: str) -> None:
    token, _ = await seed(settings)
    headers = {"Authorization": f"Bearer {token}"}
    limits = httpx.Limits(max_connections=READS + 10, max_keepalive_connections=READS + 10)
    async with httpx.AsyncClient(base_url=served, timeout=httpx.Timeout(120), limits=limits) as c:
        for i in range(5):
            body = {"goal": f"g{i}", "agent": "fixer", "runtime": "command", "command": ["true"]}
            assert (await c.post(TASKS, json=body, headers=headers)).status_code == 201
        before = await counted(served)
        # A token the server has not seen yet: every request resolves it (no cache to lean on).
        fresh = {"Authorization": f"Bearer {await new_token(settings)}"}
        started = time.monotonic()
        answers = await asyncio.gather(*(c.get(TASKS, headers=fresh) for _ in range(READS)))
        took = time.monotonic() - started
        statuses = Counter(str(r.status_code) for r in answers)
        print(f"{READS} concurrent reads: {dict(statuses)} in {took:.2f}s")
        # Refused by the authentication middleware itself: counted as what they were (not 200).
        for _ in range(10):
            statuses[str((await c.get(TASKS, headers={"Authorization": "Bearer not-a-token"})).status_code)] += 1
    after = await counted(served)
    assert statuses == {"200": READS, "401": 10}, [r.text[:200] for r in answers if r.status_code != 200][:3]
    assert after - before == statuses


async def new_token(settings: Settings) -> str:
    db = Database(settings.effective_database_url)
    try:
        async with db.session(write=True) as s:
            ana = await accounts.require_by_login(s, "ana")
            return (await tokens.create(s, Actor.system("test"), ana, "reads", ["repo:read", "tasks:read"], None)).token
    finally:
        await db.dispose()
