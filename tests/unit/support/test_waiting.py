"""The test suite's waits (tests/support/waiting.py): they return on the look that finds the
condition true, and fail naming what they waited for and the last value they saw."""

import asyncio
import re
import threading

import pytest

from tests.support.waiting import event, event_sync, loop_turns, until, until_sync


class Counter:
    """A check that turns true on its `ready_at`-th look, counting the looks."""

    def __init__(self, ready_at: int) -> None:
        self.ready_at = ready_at
        self.looks = 0

    def __call__(self) -> str | None:
        self.looks += 1
        return f"ready after {self.looks}" if self.looks >= self.ready_at else None


async def test_until_returns_the_value_on_the_look_that_finds_it() -> None:
    check = Counter(3)
    assert await until(check, timeout=30, what="the counter") == "ready after 3"
    assert check.looks == 3


async def test_until_awaits_a_coroutine_check() -> None:
    check = Counter(2)

    async def look() -> str | None:
        return check()

    assert await until(look, timeout=30, what="the counter") == "ready after 2"
    assert check.looks == 2


async def test_until_returns_at_once_when_the_condition_already_holds() -> None:
    check = Counter(1)
    assert await until(check, timeout=30, what="the counter") == "ready after 1"
    assert check.looks == 1


async def test_until_wakes_on_a_change_made_by_another_task() -> None:
    state = {"phase": "starting"}

    async def change() -> None:
        await asyncio.sleep(0)
        state["phase"] = "running"

    changer = asyncio.create_task(change())
    assert await until(lambda: state["phase"] == "running", timeout=30, what="the phase") is True
    await changer


async def test_until_fails_naming_what_it_waited_for_and_the_last_value() -> None:
    with pytest.raises(AssertionError) as e:
        await until(list, timeout=0.05, what="the webhook delivery")
    assert "the webhook delivery" in str(e.value)
    assert "last seen: []" in str(e.value)


async def test_until_can_show_what_the_check_looked_at() -> None:
    task = {"state": "queued"}
    shown = re.escape("task 3 to end; last seen: {'state': 'queued'}")
    with pytest.raises(AssertionError, match=shown):
        await until(lambda: task["state"] == "ended", timeout=0.05, what="task 3 to end", show=lambda: task)
    with pytest.raises(AssertionError, match=shown):
        until_sync(lambda: task["state"] == "ended", timeout=0.05, what="task 3 to end", show=lambda: task)


async def test_until_counts_an_ignored_exception_as_not_yet() -> None:
    looks = [0]

    def check() -> bool:
        looks[0] += 1
        if looks[0] < 3:
            raise ConnectionRefusedError("not listening yet")
        return True

    assert await until(check, timeout=30, what="the server", ignoring=(ConnectionRefusedError,))
    assert looks[0] == 3
    with pytest.raises(AssertionError, match=r"the socket.*refused"):
        await until(_refuse, timeout=0.05, what="the socket", ignoring=(OSError,))


async def test_until_lets_any_other_exception_through() -> None:
    with pytest.raises(ConnectionRefusedError):
        await until(_refuse, timeout=30, what="the socket", ignoring=(KeyError,))


def test_until_sync_returns_the_value_on_the_look_that_finds_it() -> None:
    check = Counter(4)
    assert until_sync(check, timeout=30, what="the counter") == "ready after 4"
    assert check.looks == 4


def test_until_sync_fails_naming_what_it_waited_for_and_the_last_value() -> None:
    with pytest.raises(AssertionError) as e:
        until_sync(lambda: 0, timeout=0.05, what="the row in deliveries")
    assert "the row in deliveries" in str(e.value)
    assert "last seen: 0" in str(e.value)


def test_until_sync_counts_an_ignored_exception_as_not_yet() -> None:
    with pytest.raises(AssertionError, match=r"the socket.*refused"):
        until_sync(_refuse, timeout=0.05, what="the socket", ignoring=(OSError,))


def _refuse() -> bool:
    raise ConnectionRefusedError("refused")


async def test_event_returns_when_set_and_fails_naming_it() -> None:
    ev = asyncio.Event()
    asyncio.get_running_loop().call_soon(ev.set)
    await event(ev, timeout=30, what="the start")
    with pytest.raises(AssertionError, match="the second start"):
        await event(asyncio.Event(), timeout=0.05, what="the second start")


def test_event_sync_returns_when_set_and_fails_naming_it() -> None:
    ev = threading.Event()
    setter = threading.Thread(target=ev.set)
    setter.start()
    event_sync(ev, timeout=30, what="the request")
    setter.join()
    with pytest.raises(AssertionError, match="the other request"):
        event_sync(threading.Event(), timeout=0.05, what="the other request")


async def test_loop_turns_lets_ready_tasks_run_without_time_passing() -> None:
    steps: list[int] = []

    async def three_steps() -> None:
        for n in range(3):
            steps.append(n)
            await asyncio.sleep(0)

    task = asyncio.ensure_future(three_steps())
    await loop_turns()
    assert steps == [0, 1, 2] and task.done()
