"""Waiting on the thing a test stands for, with a deadline: never a fixed sleep.

`until` (async) and `until_sync` poll a check with a short backoff (a few milliseconds first,
then up to `interval`) and return its first truthy value; when the deadline passes they fail
with an AssertionError naming what was awaited and the last value seen. `event` and
`event_sync` wait for an `asyncio.Event` / `threading.Event` that the code under test (or a fake
server) sets. `loop_turns` lets ready tasks run with no time passing (for an absence on one loop
where the test holds everything the code could wait on). A deadline is there so that a hang
fails, with room for a loaded runner, never to measure speed.
"""

import asyncio
import inspect
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar, overload

T = TypeVar("T")

FIRST_INTERVAL = 0.005
"""The first pause between two looks; it doubles up to the caller's `interval`."""


class _Nothing:
    def __repr__(self) -> str:
        return "nothing (the check never returned)"


_NOTHING = _Nothing()


def _failure(what: str, timeout: float, last: object) -> AssertionError:
    return AssertionError(f"waited {timeout:g} s for {what}; last seen: {last!r}")


def _pauses(interval: float) -> Iterator[float]:
    pause = min(FIRST_INTERVAL, interval)
    while True:
        yield pause
        pause = min(pause * 2, interval)


@overload
async def until(
    check: Callable[[], Awaitable[T]],
    *,
    timeout: float,
    what: str,
    interval: float = ...,
    ignoring: tuple[type[BaseException], ...] = ...,
    show: Callable[[], object] | None = ...,
) -> T: ...
@overload
async def until(
    check: Callable[[], T],
    *,
    timeout: float,
    what: str,
    interval: float = ...,
    ignoring: tuple[type[BaseException], ...] = ...,
    show: Callable[[], object] | None = ...,
) -> T: ...
async def until(
    check: Callable[[], object],
    *,
    timeout: float,
    what: str,
    interval: float = 0.2,
    ignoring: tuple[type[BaseException], ...] = (),
    show: Callable[[], object] | None = None,
) -> object:
    """Call `check` (a function or a coroutine function) until it returns a truthy value and
    return that value. An exception listed in `ignoring` counts as "not yet" (and is the last
    value seen); any other propagates. Fails with an AssertionError naming `what` after `timeout`
    seconds, with the last value seen, or what `show` returns then (say, the object the check
    looked at)."""
    deadline = time.monotonic() + timeout
    last: object = _NOTHING
    for pause in _pauses(interval):
        try:
            value = check()
            if inspect.isawaitable(value):
                value = await value
        except ignoring as e:
            value = None
            last = e
        else:
            last = value
        if value:
            return value
        left = deadline - time.monotonic()
        if left <= 0:
            raise _failure(what, timeout, show() if show is not None else last)
        await asyncio.sleep(min(pause, left))
    raise AssertionError("unreachable")  # pragma: no cover


def until_sync(
    check: Callable[[], T],
    *,
    timeout: float,
    what: str,
    interval: float = 0.2,
    ignoring: tuple[type[BaseException], ...] = (),
    show: Callable[[], object] | None = None,
) -> T:
    """`until` for code outside an event loop: call `check` until it returns a truthy value."""
    deadline = time.monotonic() + timeout
    last: object = _NOTHING
    for pause in _pauses(interval):
        try:
            value = check()
        except ignoring as e:
            last = e
        else:
            last = value
            if value:
                return value
        left = deadline - time.monotonic()
        if left <= 0:
            raise _failure(what, timeout, show() if show is not None else last)
        time.sleep(min(pause, left))
    raise AssertionError("unreachable")  # pragma: no cover


async def event(ev: asyncio.Event, *, timeout: float, what: str) -> None:
    """Wait until `ev` is set, or fail naming `what`."""
    try:
        await asyncio.wait_for(ev.wait(), timeout)
    except TimeoutError:
        raise AssertionError(f"waited {timeout:g} s for {what}; it was not set") from None


def event_sync(ev: threading.Event, *, timeout: float, what: str) -> None:
    """Wait until the threading event `ev` is set, or fail naming `what`."""
    if not ev.wait(timeout):
        raise AssertionError(f"waited {timeout:g} s for {what}; it was not set")


async def loop_turns(turns: int = 10) -> None:
    """Let every task that is ready run, `turns` times over, with no time passing.

    For an absence on one event loop ("this call is still waiting") where everything the call
    could wait on is held by the test (an event it has not set) and the rest is work without I/O:
    a task that was going to finish has finished by then, however loaded the machine."""
    for _ in range(turns):
        await asyncio.sleep(0)
