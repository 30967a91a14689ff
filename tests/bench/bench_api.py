"""Requests/second of `GET /api/v1/user` with a token, as a ratio against a bare Litestar app that
returns the same JSON, measured in the same run over the same in-process ASGI transport.

Run: `make bench` (prints the figures; the goal is a ratio of at least 0.5)."""

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

import httpx
from litestar import Litestar, get

from forge.app.factory import create_app
from forge.core.settings import load_settings, prepare_data_dir
from forge.db.engine import Database
from forge.db.migrate import upgrade_async
from tests.support.accounts import Accounts

logging.getLogger("httpx").setLevel(logging.WARNING)
REQUESTS = 3000
CONCURRENCY = 16


async def _rps(app: Any, headers: dict[str, str]) -> float:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
        for _ in range(50):  # warm up
            assert (await client.get("/api/v1/user", headers=headers)).status_code == 200
        remaining = REQUESTS

        async def worker() -> None:
            nonlocal remaining
            while remaining > 0:
                remaining -= 1
                r = await client.get("/api/v1/user", headers=headers)
                assert r.status_code == 200

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
        return REQUESTS / (time.perf_counter() - start)


def _bare_app(payload: dict[str, Any]) -> Litestar:
    @get("/api/v1/user")
    async def user() -> dict[str, Any]:
        return payload

    return Litestar([user])


async def _measure(tmp_path: Path, cache_seconds: float) -> tuple[float, float]:
    url = f"sqlite+aiosqlite:///{tmp_path / f'bench-{cache_seconds}.db'}"
    await upgrade_async(url)
    settings = prepare_data_dir(
        load_settings(
            environ={},
            data_dir=tmp_path / f"data-{cache_seconds}",
            database_url=url,
            token_cache_seconds=cache_seconds,
            log_level="error",
        )
    )
    db = Database(url)
    helper = Accounts(db=db)
    await helper.user("ana")
    token = await helper.token("ana", "repo:read")
    headers = {"Authorization": f"Bearer {token}"}
    app = create_app(settings, db=db)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://bench") as c:
        payload = (await c.get("/api/v1/user", headers=headers)).json()
    bare = await _rps(_bare_app(payload), headers)
    ours = await _rps(app, headers)
    await db.dispose()
    return bare, ours


def test_bench_api_user(tmp_path: Path) -> None:
    for cache_seconds, label in ((5.0, "token cache 5 s (default)"), (0.0, "no token cache (DB per request)")):
        bare, ours = asyncio.run(_measure(tmp_path, cache_seconds))
        print(
            f"\nGET /api/v1/user with a token, {label}: forgehand {ours:,.0f} req/s, bare Litestar {bare:,.0f} req/s,"
            f" ratio {ours / bare:.2f} (goal >= 0.5)"
        )
