"""Shared fixtures: a real database (SQLite file, or PostgreSQL when FORGEHAND_TEST_DATABASE_URL is
set), the real app, accounts and tokens made through the real services."""

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import argon2.profiles
import msgspec
import pytest
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings
from litestar import Litestar
from litestar.testing import AsyncTestClient

from forge.app.factory import create_app
from forge.core.security import use_password_parameters
from forge.core.settings import Settings, load_settings, prepare_data_dir
from forge.db.engine import Database
from tests.support import databases, xdist_groups
from tests.support.accounts import Accounts, LiveServer
from tests.support.ports import free_port
from tests.support.waiting import until_sync

# Property tests check what holds, not how fast the machine is: on a loaded 2-CPU runner the default
# 200 ms deadline and the "generation is slow" health check failed tests that were correct. Example
# counts stay as each test sets them.
hypothesis_settings.register_profile(
    "forgehand", deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
hypothesis_settings.load_profile("forgehand")

# Passwords hashed in microseconds, not 0.1-0.5 s and 64 MiB each: thousands of accounts are made
# across the suite, and the hashing is not what these tests check (tests/unit/forge/accounts/test_security.py
# checks the default parameters).
use_password_parameters(argon2.profiles.CHEAPEST)


def _databases() -> list[str]:
    """The databases the `db` tests run on: `FORGEHAND_TEST_DATABASES` (`sqlite`, `postgresql` or
    both, comma-separated); by default PostgreSQL when `FORGEHAND_TEST_DATABASE_URL` names one, else
    SQLite. With both, each `db` test runs twice (ids `[sqlite]`, `[postgresql]`) in one pool of
    workers: CI's one pass over both databases."""
    default = "postgresql" if os.environ.get("FORGEHAND_TEST_DATABASE_URL") else "sqlite"
    chosen = [d.strip() for d in os.environ.get("FORGEHAND_TEST_DATABASES", default).split(",") if d.strip()]
    unknown = set(chosen) - {"sqlite", "postgresql"}
    if unknown or not chosen:
        raise pytest.UsageError(f"FORGEHAND_TEST_DATABASES: expected sqlite and/or postgresql, got {chosen}")
    if "postgresql" in chosen and not os.environ.get("FORGEHAND_TEST_DATABASE_URL"):
        raise pytest.UsageError(
            "FORGEHAND_TEST_DATABASES names postgresql: set FORGEHAND_TEST_DATABASE_URL to a "
            "postgresql+asyncpg:// URL of a database whose role may create databases"
        )
    return chosen


DOCKER_TESTS = Path(__file__).parent / "docker"


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    chosen = _databases()
    if "db_url" not in metafunc.fixturenames or len(chosen) < 2:
        return
    docker = DOCKER_TESTS in metafunc.definition.path.parents  # its marker is added after this hook
    marked = metafunc.definition.get_closest_marker
    if (docker and not marked("both_databases")) or marked("postgresql_when_both"):
        # What a docker test proves is the sandbox's and the agent's, not the database's: with
        # both databases chosen it runs once, on PostgreSQL (the integration tests prove each
        # database's part on both; a docker test whose point is the database says so). So does
        # an integration test whose cost is volume and whose stricter database is PostgreSQL
        # (`make test`, SQLite only, still runs it there).
        chosen = ["postgresql"]
    metafunc.parametrize("db_url", chosen, indirect=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Every test that touches the database carries the `db` marker, so CI can rerun them on PostgreSQL.
    for item in items:
        if "db_url" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.db)
    xdist_groups.apply(config, items)  # `xdist_group` marks taking effect under pytest 9


@pytest.fixture
async def db_url(request: pytest.FixtureRequest, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A migrated database of the test's own (a copy of one template: tests/support/databases.py)."""
    which = getattr(request, "param", None) or _databases()[0]
    if which == "postgresql":
        return await databases.postgres_copy(os.environ["FORGEHAND_TEST_DATABASE_URL"])
    template = databases.sqlite_template(tmp_path_factory.getbasetemp())
    return databases.sqlite_copy(template, tmp_path / "forgehand.db")


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


@pytest.fixture
def make(db: Database) -> Accounts:
    return Accounts(db=db)


@pytest.fixture
def live_server(settings: Settings, db_url: str) -> Iterator[LiveServer]:
    """The real app served by uvicorn on 127.0.0.1 (a free port), in a thread with its own loop."""
    import threading

    import uvicorn

    port = free_port()
    served = msgspec.structs.replace(settings, host="127.0.0.1", port=port, base_url=f"http://127.0.0.1:{port}")
    config = uvicorn.Config(create_app(served), host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    until_sync(lambda: server.started or not thread.is_alive(), timeout=30, what="the test server to start")
    if not server.started:
        raise RuntimeError("the test server did not start")
    yield LiveServer(url=f"http://127.0.0.1:{port}", settings=served)
    server.should_exit = True
    thread.join(timeout=30)
