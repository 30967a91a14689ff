"""Shared fixtures: a real database (SQLite file, or PostgreSQL when FORGEHAND_TEST_DATABASE_URL is
set), the real app, accounts and tokens made through the real services."""

import os
from collections.abc import AsyncIterator, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy import text

from forge import accounts, tokens
from forge.app import create_app
from forge.audit import Actor
from forge.db import Database, create_engine
from forge.migrate import upgrade_async
from forge.models import Account
from forge.settings import Settings, load_settings, prepare_data_dir

PASSWORD = "correct horse battery"
T = TypeVar("T")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Every test that touches the database carries the `db` marker, so CI can rerun them on PostgreSQL.
    for item in items:
        if "db_url" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.db)


async def _reset_postgres(url: str) -> None:
    engine = create_engine(url)
    async with engine.begin() as conn:
        await conn.execute(text("DROP SCHEMA IF EXISTS public CASCADE"))
        await conn.execute(text("CREATE SCHEMA public"))
    await engine.dispose()


@pytest.fixture
async def db_url(tmp_path: Path) -> str:
    url = os.environ.get("FORGEHAND_TEST_DATABASE_URL", "")
    if url:
        await _reset_postgres(url)
    else:
        url = f"sqlite+aiosqlite:///{tmp_path / 'forgehand.db'}"
    await upgrade_async(url)
    return url


@pytest.fixture
def settings(tmp_path: Path, db_url: str) -> Settings:
    return prepare_data_dir(
        load_settings(
            environ={},
            data_dir=tmp_path / "data",
            database_url=db_url,
            base_url="http://testserver.local",
            log_level="warning",
            run_worker=False,
            seed_demo=False,
        )
    )


@pytest.fixture
async def db(settings: Settings) -> AsyncIterator[Database]:
    database = Database(settings.effective_database_url)
    yield database
    await database.dispose()


@pytest.fixture
def app(settings: Settings) -> Litestar:
    # The app gets its own Database: the test client may run it on another event loop, and
    # asyncpg connections belong to the loop that made them.
    return create_app(settings)


@pytest.fixture
async def client(app: Litestar) -> AsyncIterator[AsyncTestClient[Litestar]]:
    async with AsyncTestClient(app=app, base_url="http://testserver.local") as c:
        yield c


class Accounts(msgspec.Struct):
    """Helpers that make accounts and tokens through the real services."""

    db: Database

    async def user(self, login: str, *, admin: bool = False, password: str = PASSWORD) -> Account:
        async with self.db.session(write=True) as s:
            return await accounts.create_user(s, Actor.system("test"), login, password, is_admin=admin)

    async def bot(self, login: str) -> Account:
        async with self.db.session(write=True) as s:
            return await accounts.create_bot(s, Actor.system("test"), login)

    async def token(self, login: str, *scopes: str, expires_days: int | None = None) -> str:
        async with self.db.session(write=True) as s:
            owner = await accounts.require_by_login(s, login)
            created = await tokens.create(s, Actor.system("test"), owner, "test", list(scopes), expires_days)
        return created.token


@pytest.fixture
def make(db: Database) -> Accounts:
    return Accounts(db=db)


class LiveServer(msgspec.Struct):
    url: str
    settings: Settings


@pytest.fixture
def live_server(settings: Settings, db_url: str) -> Iterator[LiveServer]:
    """The real app served by uvicorn on 127.0.0.1 (a free port), in a thread with its own loop."""
    import socket
    import threading
    import time

    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    served = msgspec.structs.replace(settings, host="127.0.0.1", port=port, base_url=f"http://127.0.0.1:{port}")
    config = uvicorn.Config(create_app(served), host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    yield LiveServer(url=f"http://127.0.0.1:{port}", settings=served)
    server.should_exit = True
    thread.join(timeout=30)


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine from a synchronous test (each call gets a fresh loop and engine)."""
    import asyncio

    return asyncio.run(coro)


async def make_account_with_token(settings: Settings, login: str, *scopes: str, admin: bool = False) -> str:
    database = Database(settings.effective_database_url)
    try:
        helper = Accounts(db=database)
        await helper.user(login, admin=admin)
        return await helper.token(login, *scopes)
    finally:
        await database.dispose()
