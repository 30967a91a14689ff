"""What browser tests share besides fixtures: the live server they get (`ForgeServer`, started by
`serve_forge`) and how synchronous tests run async set-up (`run_async`)."""

import asyncio
import threading
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from forge.accounts import accounts
from forge.core.settings import Settings, load_settings, prepare_data_dir
from forge.db.audit import Actor
from forge.db.engine import Database
from forge.db.migrate import upgrade_async
from tests.support.ports import free_port
from tests.support.waiting import until_sync

T = TypeVar("T")
ADMIN_LOGIN = "ada"
ADMIN_PASSWORD = "correct horse battery staple"


class ForgeServer(msgspec.Struct):
    """A live forgehand and the instance admin whose password the test knows."""

    url: str
    settings: Settings
    admin_login: str
    admin_password: str

    def at(self, path: str) -> str:
        return self.url + path


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine to completion on a loop of its own, in a thread of its own: browser tests are
    synchronous (Playwright's sync API holds the main thread's loop), so set-up that needs the async
    services (seeding accounts, repositories, ...) goes through here."""
    out: list[T] = []
    errors: list[BaseException] = []

    def target() -> None:
        try:
            out.append(asyncio.run(coro))
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    return out[0]


async def _prepare(settings: Settings) -> None:
    await upgrade_async(settings.effective_database_url)
    db = Database(settings.effective_database_url)
    try:
        async with db.session(write=True) as s:
            await accounts.create_user(s, Actor.system("test"), ADMIN_LOGIN, ADMIN_PASSWORD, is_admin=True)
    finally:
        await db.dispose()


@contextmanager
def serve_forge(tmp_path: Path, overrides: dict[str, Any]) -> Iterator[ForgeServer]:
    """The real app served by uvicorn on 127.0.0.1 in a thread (SQLite under `tmp_path`, the
    in-process worker unless `overrides` turn it off), with one instance admin."""
    import uvicorn

    from forge.app.factory import create_app

    port = free_port()
    defaults: dict[str, Any] = {
        "data_dir": tmp_path / "data",
        "database_url": f"sqlite+aiosqlite:///{tmp_path / 'forgehand.db'}",
        "host": "127.0.0.1",
        "port": port,
        "base_url": f"http://127.0.0.1:{port}",
        "log_level": "warning",
        "run_worker": True,
        "seed_demo": False,
        "webhooks_deliver": False,
        "task_wall_clock_seconds": 600,
    }
    settings = prepare_data_dir(load_settings(environ={}, **{**defaults, **overrides}))
    run_async(_prepare(settings))
    server = uvicorn.Server(
        uvicorn.Config(create_app(settings), host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    )
    thread = threading.Thread(target=server.run, name="forgehand-browser-test-server", daemon=True)
    thread.start()
    until_sync(lambda: server.started or not thread.is_alive(), timeout=30, what="the forgehand test server to start")
    if not server.started:
        raise RuntimeError("the forgehand test server did not start")
    try:
        yield ForgeServer(
            url=f"http://127.0.0.1:{port}",
            settings=settings,
            admin_login=ADMIN_LOGIN,
            admin_password=ADMIN_PASSWORD,
        )
    finally:
        server.should_exit = True
        thread.join(timeout=90)


USER_PASSWORD = "correct horse battery"


def make_user(site: ForgeServer, login: str, password: str = USER_PASSWORD) -> None:
    """A plain user account on the live forge (set up as the services would make it)."""

    async def go() -> None:
        db = Database(site.settings.effective_database_url)
        try:
            async with db.session(write=True) as s:
                await accounts.create_user(s, Actor.system("test"), login, password)
        finally:
            await db.dispose()

    run_async(go())
