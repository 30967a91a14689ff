"""SSE clients' lag for the ingest benches: the real app served by uvicorn in a thread of the
bench's process (so a TranscriptWriter in the bench notifies the same LiveHub the SSE endpoint
waits on), and real SSE clients (httpx streaming) on a task's `/events` that stop once they had
every event they expect. Lag per event: the writer's timestamp (`at`, when it was emitted) -> the
client had it, as tests/bench/bench_tasks.py measures it."""

import asyncio
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import httpx
import msgspec

from forge.settings import Settings
from tasks.core.live import LiveHub
from tests.support.tasks import serve

TASKS = "/api/v1/repos/ana/demo/tasks"


class Served(msgspec.Struct):
    url: str
    hub: LiveHub


@contextmanager
def served(settings: Settings) -> Iterator[Served]:
    apps: list[Any] = []
    for url in serve(settings, on_app=apps.append):
        yield Served(url=url, hub=apps[0].state["tasks"].hub)


async def follow(client: httpx.AsyncClient, number: int, kinds: set[str], expect: int, lags: list[float]) -> None:
    """Read task `number`'s SSE stream until `expect` events of `kinds` arrived; their lags."""
    seen = 0
    async with client.stream("GET", f"{TASKS}/{number}/events", headers={"Accept": "text/event-stream"}) as r:
        assert r.status_code == 200, await r.aread()
        event, data = "message", ""
        async for line in r.aiter_lines():
            if line == "":
                if data and event in kinds:
                    received = time.time()
                    at = msgspec.json.decode(data)["at"]
                    lags.append(received - datetime.fromisoformat(at.replace("Z", "+00:00")).timestamp())
                    seen += 1
                    if seen >= expect:
                        return
                event, data = "message", ""
            elif line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:"):
                data += line[5:].strip()
    raise AssertionError(f"task {number}'s stream ended after {seen} of {expect} events")


async def subscribed(
    url: str, token: str, number: int, clients: int, kinds: set[str], expect: int
) -> tuple[asyncio.Future[list[None]], list[float]]:
    """`clients` SSE clients following task `number` (connected when this returns) and their lags."""
    lags: list[float] = []
    http = httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=300)
    followers = asyncio.gather(*(follow(http, number, kinds, expect, lags) for _ in range(clients)))
    followers.add_done_callback(lambda _: asyncio.ensure_future(http.aclose()))
    await asyncio.sleep(0.5)  # connected and replayed (nothing yet) before the stream starts
    return followers, lags


def figures(lags: list[float]) -> str:
    ms = [x * 1000 for x in lags]
    p95 = statistics.quantiles(ms, n=20)[-1]
    return f"median {statistics.median(ms):,.1f} ms, p95 {p95:,.1f} ms, max {max(ms):,.1f} ms"
