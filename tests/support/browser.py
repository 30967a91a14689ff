"""What browser tests share besides fixtures: the live server they get (`ForgeServer`) and how
synchronous tests run async set-up (`run_async`)."""

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

import msgspec

from forge.settings import Settings

T = TypeVar("T")


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
