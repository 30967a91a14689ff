"""SSE clients' lag for the ingest benches: the real app served by uvicorn in a thread of the
bench's process (so a TranscriptWriter in the bench notifies the same LiveHub the SSE endpoint
waits on), and real SSE clients (httpx streaming) on a task's `/events`, in a process of their
own (as in tests/bench/bench_tasks.py, their parsing does not share the server's GIL), that stop
once they had every event they expect. Lag per event: the writer's timestamp (`at`, when it was
emitted) -> the client had it, as the tasks bench measures it.

    async with subscribed(app.url, token, number, clients=10, kinds={"tool_call"}, expect=N) as lags:
        ...  # ingest; on leaving, every client had its N events and `lags` holds them"""

import asyncio
import json
import os
import statistics
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import msgspec

from forge.app.heap import freeze_startup_heap
from forge.core.settings import Settings
from tasks.core.live import LiveHub
from tests.support.tasks import serve

TASKS = "/api/v1/repos/ana/demo/tasks"


class Served(msgspec.Struct):
    url: str
    hub: LiveHub


@contextmanager
def served(settings: Settings) -> Iterator[Served]:
    """The app served in this process, its startup heap frozen as `forgehand serve` freezes it (a
    bench's process only: frozen objects stay for the process's life)."""
    apps: list[Any] = []
    for url in serve(settings, on_app=apps.append):
        freeze_startup_heap()
        yield Served(url=url, hub=apps[0].state["tasks"].hub)


async def sse_frames(response: httpx.Response) -> AsyncIterator[tuple[str, str]]:
    """The (event, data) frames of a server-sent event stream, as they arrive (frames without
    data are skipped)."""
    event, data = "message", ""
    async for line in response.aiter_lines():
        if line == "":
            if data:
                yield event, data
            event, data = "message", ""
        elif line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data += line[5:].strip()


async def follow(
    client: httpx.AsyncClient,
    number: int,
    kinds: set[str],
    expect: int,
    lags: list[float],
    connected: Any,
    after: int = 0,
) -> None:
    """Read task `number`'s SSE stream after seq `after` until `expect` events of `kinds` ("*": any
    transcript event) arrived; their lags."""
    seen = 0
    headers = {"Accept": "text/event-stream"}
    async with client.stream("GET", f"{TASKS}/{number}/events", params={"after": after}, headers=headers) as r:
        assert r.status_code == 200, await r.aread()
        connected()
        async for event, data in sse_frames(r):
            if event in kinds or ("*" in kinds and event not in ("state", "end", "message")):
                received = time.time()
                at = msgspec.json.decode(data)["at"]
                lags.append(received - datetime.fromisoformat(at.replace("Z", "+00:00")).timestamp())
                seen += 1
                if seen >= expect:
                    return
    raise AssertionError(f"task {number}'s stream ended after {seen} of {expect} events")


async def _clients(url: str, token: str, number: int, clients: int, kinds: list[str], expect: int, after: int) -> None:
    """The client process: prints `ready` once every client is connected, then the lags as JSON."""
    lags: list[float] = []
    count = [0]

    def connected() -> None:
        count[0] += 1
        if count[0] == clients:
            print("ready", flush=True)

    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=300) as http:
        await asyncio.gather(
            *(follow(http, number, set(kinds), expect, lags, connected, after) for _ in range(clients))
        )
    print(json.dumps(lags), flush=True)


def clients_main() -> None:
    asyncio.run(_clients(*json.loads(sys.argv[1])))


@asynccontextmanager
async def subscribed(
    url: str, token: str, number: int, *, clients: int, kinds: set[str], expect: int, after: int = 0
) -> AsyncIterator[list[float]]:
    """`clients` SSE clients following task `number` after seq `after` (all connected on entry);
    on leaving, once each had `expect` events of `kinds`, their lags (seconds)."""
    lags: list[float] = []
    args = json.dumps([url, token, number, clients, sorted(kinds), expect, after])
    code = "from tests.support.sse_lag import clients_main; clients_main()"
    root = str(Path(__file__).resolve().parents[2])
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, args, cwd=root, stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": root},
    )  # fmt: skip
    assert proc.stdout is not None
    try:
        ready = await asyncio.wait_for(proc.stdout.readline(), 60)
        assert ready.strip() == b"ready", ready
        yield lags
        out = await asyncio.wait_for(proc.stdout.read(), 300)
        assert await proc.wait() == 0, "an SSE client failed"
        lags.extend(json.loads(out.splitlines()[-1]))
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def figures(lags: list[float]) -> str:
    ms = [x * 1000 for x in lags]
    p95 = statistics.quantiles(ms, n=20)[-1]
    return f"median {statistics.median(ms):,.1f} ms, p95 {p95:,.1f} ms, max {max(ms):,.1f} ms"
