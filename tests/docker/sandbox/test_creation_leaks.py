"""No sandbox leaks when its creation is cut off: cancelled, the engine closed, the process killed.

The docker SDK blocks in threads that a cancelled `await` cannot stop; these tests stop a creation at
each point (inside create, between create and start, right after start) and at random delays, and
then look at the engine for anything left with the test's labels.
"""

import asyncio
import contextlib
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import docker
import pytest
from docker.api.client import APIClient

import sandbox.creation as sandbox_creation
import sandbox.engine as sandbox_engine
from sandbox import (
    GATEWAY_RELAY_PORT,
    EngineUnavailable,
    MiB,
    Relay,
    SandboxEngine,
    SandboxPool,
    list_sandboxes,
    prepare_workspace,
    quota_mounts,
    reap,
    remove_workspace,
    sweep_pool_dirs,
)
from tests.docker.conftest import INSTANCE, SpecFactory
from tests.support.waiting import until

POINTS = ["in_create", "between_create_and_start", "after_start"]


class Gate:
    """Holds the creating thread at one point until released, and says when it got there."""

    def __init__(self) -> None:
        self.reached = threading.Event()
        self.release = threading.Event()
        self.created = threading.Event()  # the engine answered the create (the container exists)

    def hold(self) -> None:
        self.reached.set()
        self.release.wait(30)

    async def wait_reached(self) -> None:
        assert await asyncio.to_thread(self.reached.wait, 30), "the creating thread never got there"


@pytest.fixture
def gate_at(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], Gate]]:
    gates: list[Gate] = []

    def install(point: str) -> Gate:
        gate = Gate()
        gates.append(gate)
        create, start = APIClient.create_container, APIClient.start

        def held_create(self: APIClient, *args: Any, **kwargs: Any) -> Any:
            if point == "in_create":
                gate.hold()  # the request goes out after the caller gave up
            try:
                return create(self, *args, **kwargs)
            finally:
                gate.created.set()

        def held_start(self: APIClient, *args: Any, **kwargs: Any) -> Any:
            if point == "between_create_and_start":
                gate.hold()
            result = start(self, *args, **kwargs)
            if point == "after_start":
                gate.hold()
            return result

        monkeypatch.setattr(APIClient, "create_container", held_create)
        monkeypatch.setattr(APIClient, "start", held_start)
        return gate

    yield install
    for gate in gates:  # never leave a thread parked
        gate.release.set()


async def _left(engine: SandboxEngine, run_prefix: str) -> list[str]:
    return [s.name for s in await list_sandboxes(engine, INSTANCE) if s.run.startswith(run_prefix)]


async def _none_left_soon(engine: SandboxEngine, run_prefix: str, within: float = 15.0) -> list[str]:
    left: list[str] = []

    async def none_left() -> bool:
        nonlocal left
        left = await _left(engine, run_prefix)
        return not left

    await until(none_left, timeout=within, what=f"no {run_prefix}* sandbox to be left", show=lambda: left)
    return left


@pytest.mark.parametrize("how", ["cancel", "close"])
@pytest.mark.parametrize("point", POINTS)
async def test_cut_off_at_each_point_leaves_nothing(
    sandbox_image: str, make_spec: SpecFactory, gate_at: Callable[[str], Gate], point: str, how: str
) -> None:
    gate = gate_at(point)
    run = f"{how}-{point}"
    engine = SandboxEngine()
    try:
        starting = asyncio.create_task(engine.start(make_spec(run=run)))
        await gate.wait_reached()
        if how == "cancel":
            starting.cancel()
            gate.release.set()
            with pytest.raises(asyncio.CancelledError):
                await starting
            # The creating thread cleans up by itself, once the engine has answered.
            assert await asyncio.to_thread(gate.created.wait, 30)
            assert await _none_left_soon(engine, run) == []
        else:
            closing = asyncio.create_task(engine.close())
            # An absence (close has not returned): no event marks "close is waiting", and a close
            # that did not wait would still hop through threads before returning, so the time
            # gives it the chance to.
            await asyncio.sleep(0.1)
            assert not closing.done()  # close waits for the creation
            gate.release.set()
            await closing
            with pytest.raises(EngineUnavailable):
                await starting
            async with SandboxEngine() as fresh:
                assert await _left(fresh, run) == []  # close waited: nothing to poll for
    finally:
        await engine.close()


async def test_random_cancellations_leave_nothing(engine: SandboxEngine, make_spec: SpecFactory) -> None:
    rng = random.Random(os.environ.get("FORGEHAND_TEST_SEED", "13"))
    outcomes = {"cancelled": 0, "completed": 0}
    for trial in range(20):
        starting = asyncio.create_task(engine.start(make_spec(run=f"rcancel-{trial}")))
        await asyncio.sleep(rng.uniform(0, 0.6))  # a random cut point: the scenario
        starting.cancel()
        try:
            sandbox = await starting
        except asyncio.CancelledError:
            outcomes["cancelled"] += 1
        else:  # finished before the cancel: the caller holds it and removes it
            outcomes["completed"] += 1
            await sandbox.remove()
    assert await _none_left_soon(engine, "rcancel-") == [], outcomes
    assert outcomes["cancelled"] > 0, outcomes


async def test_random_shutdowns_leave_nothing(
    sandbox_image: str, make_spec: SpecFactory, docker_client: docker.DockerClient
) -> None:
    rng = random.Random(os.environ.get("FORGEHAND_TEST_SEED", "13"))
    outcomes = {"cancelled": 0, "closed": 0, "completed": 0}
    for trial in range(20):
        engine = SandboxEngine()
        starts = [asyncio.create_task(engine.start(make_spec(run=f"rclose-{trial}-{i}"))) for i in range(2)]
        await asyncio.sleep(rng.uniform(0, 0.6))  # a random cut point: the scenario
        # What a server's shutdown does: cancel the runs, then close the engine.
        starts[0].cancel()
        await engine.close()
        for outcome in await asyncio.gather(*starts, return_exceptions=True):
            if isinstance(outcome, asyncio.CancelledError):
                outcomes["cancelled"] += 1
            elif isinstance(outcome, EngineUnavailable):
                outcomes["closed"] += 1
            else:  # started before the close: its holder's to remove (the engine is closed now)
                assert not isinstance(outcome, BaseException), outcome
                outcomes["completed"] += 1
                outcome.cancel_wall_clock()
                docker_client.api.remove_container(outcome.id, force=True)
    async with SandboxEngine() as fresh:
        assert await _left(fresh, "rclose-") == [], outcomes  # close waited: nothing to poll for
    assert outcomes["cancelled"] + outcomes["closed"] > 0, outcomes


async def test_close_waits_for_a_start_past_its_creation(
    make_spec: SpecFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The container exists and runs; the start is still at its relays when the engine closes.

    A close that did not wait shut the thread pool down under the start, whose removal then ran in a
    thread nobody waited for (or failed to be scheduled): a container left after close returned.
    """
    held, release = asyncio.Event(), asyncio.Event()
    real = sandbox_engine.start_relays

    async def slow_relays(sb: Any) -> None:
        held.set()
        await release.wait()
        await real(sb)

    monkeypatch.setattr(sandbox_engine, "start_relays", slow_relays)
    engine = SandboxEngine()
    try:
        starting = asyncio.create_task(engine.start(make_spec(run="past-create")))
        await asyncio.wait_for(held.wait(), 30)
        closing = asyncio.create_task(engine.close())
        # An absence (close has not returned): no event marks "close is waiting", and a close that
        # did not wait would still hop through threads before returning; the time gives it the chance.
        await asyncio.sleep(0.3)
        assert not closing.done()  # close waits for the start
        release.set()
        await closing
        with pytest.raises(EngineUnavailable):
            await starting
        async with SandboxEngine() as fresh:
            assert await _left(fresh, "past-create") == []  # close waited: nothing to poll for
    finally:
        release.set()
        await engine.close()


async def test_a_cancel_arriving_with_the_container_is_not_swallowed(
    engine: SandboxEngine, make_spec: SpecFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The thread hands the container over and the caller is cancelled in the same loop iteration.

    asyncio.wait_for (3.11) returned the result and dropped the cancel: the cancelled start went
    on as if nothing happened, and a shutdown that had cancelled it closed the engine under it.
    """
    entered, returned = threading.Event(), threading.Event()
    real = sandbox_creation.create_and_start

    def create_and_start(*args: Any) -> str:
        entered.set()
        try:
            return real(*args)
        finally:
            returned.set()

    monkeypatch.setattr(sandbox_creation, "create_and_start", create_and_start)
    starting = asyncio.create_task(engine.start(make_spec(run="cancel-with-result")))
    assert await asyncio.to_thread(entered.wait, 30)
    # Block the loop on purpose until the thread's answer is queued for it, then cancel.
    assert returned.wait(30)
    # The pool thread queues the answer for the loop after the function returned: nothing outside
    # asyncio's internals marks that moment, so the blocked loop gives it this long.
    time.sleep(0.2)
    starting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await starting
    assert await _none_left_soon(engine, "cancel-with-result") == []


async def test_random_shutdowns_of_a_filling_pool_leave_nothing(
    sandbox_image: str, make_spec: SpecFactory, tmp_path: Path, channel_dir: Path
) -> None:
    """A worker stopping while its pool fills: the pool closes, then the engine; no container, no
    quota mount and no slot directory may be left."""
    rng = random.Random(os.environ.get("FORGEHAND_TEST_SEED", "13"))
    root, channels = tmp_path / "pool", channel_dir / "root"
    template = make_spec(run="unused", relays=(Relay(GATEWAY_RELAY_PORT, "gateway.sock"),))
    for _ in range(6):
        engine = SandboxEngine()
        pool = SandboxPool(engine, template, size=2, root=root, channel_root=channels, workspace_limit_bytes=32 * MiB)
        pool.fill_later()
        await asyncio.sleep(rng.uniform(0, 1.2))  # a random stop point: the scenario
        await pool.close()
        await engine.close()
        async with SandboxEngine() as fresh:
            assert [s.name for s in await list_sandboxes(fresh, INSTANCE) if s.run.startswith("pool:")] == []
        assert quota_mounts(root) == []
        assert not root.exists() or list(root.iterdir()) == []
        assert not channels.exists() or list(channels.iterdir()) == []


_POOL_CREATOR = """
import asyncio, sys
from pathlib import Path
from sandbox import GATEWAY_RELAY_PORT, Limits, MiB, Relay, SandboxEngine, SandboxPool, SandboxSpec

async def main() -> None:
    instance, image, root, channels = sys.argv[1], sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4])
    spec = SandboxSpec(image=image, workspace=root, instance=instance, task="t", run="r",
                       limits=Limits(wall_clock_seconds=300), relays=(Relay(GATEWAY_RELAY_PORT, "gateway.sock"),))
    engine = SandboxEngine()
    pool = SandboxPool(engine, spec, size=2, root=root, channel_root=channels, workspace_limit_bytes=32 * MiB)
    await pool.fill()
    print("ready", flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


async def test_a_killed_workers_pool_is_reaped_and_swept(
    engine: SandboxEngine, sandbox_image: str, tmp_path: Path, channel_dir: Path
) -> None:
    """Alive, another process's idle pooled sandboxes are kept by our reap; SIGKILLed, they are
    orphans: reaped, and its slots' directories (quota mounts included) swept."""
    root, channels = tmp_path / "pool", channel_dir / "root"
    proc = subprocess.Popen(
        [sys.executable, "-c", _POOL_CREATOR, INSTANCE, sandbox_image, str(root), str(channels)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert (await asyncio.to_thread(proc.stdout.readline)).strip() == "ready"
        pooled = [s for s in await list_sandboxes(engine, INSTANCE) if s.run.startswith("pool:")]
        assert len(pooled) == 2
        # Its pool lives. (Our reap may take other processes' orphans on this engine: a parallel
        # test's killed server leaves some, and any reap on the host removes them by design.)
        lost = {s.id for s in pooled} & {s.id for s in await reap(engine, INSTANCE, keep=set())}
        assert lost == set()
        assert sweep_pool_dirs(root, channels) == []
        os.kill(proc.pid, signal.SIGKILL)
        await asyncio.to_thread(proc.wait, 30)
        removed = await reap(engine, INSTANCE, keep=set())
        assert {s.id for s in pooled} <= {s.id for s in removed}
        assert len(quota_mounts(root)) == 2
        swept = sweep_pool_dirs(root, channels)
        assert len(swept) == 3  # the pool's directory and its two channel slots
        assert quota_mounts(root) == [] and list(root.iterdir()) == [] and list(channels.iterdir()) == []
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait(30)


_CREATOR = """
import asyncio, sys
from pathlib import Path
from sandbox import Limits, SandboxEngine, SandboxSpec

async def main() -> None:
    instance, image, workspace = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    async with SandboxEngine() as engine:
        for i in range(50):
            spec = SandboxSpec(image=image, workspace=workspace, instance=instance, task="t", run=f"r{i}",
                               limits=Limits(wall_clock_seconds=300))
            sb = await engine.start(spec)
            print(sb.id, flush=True)

asyncio.run(main())
"""


@pytest.fixture
def creator_workspace(tmp_path: Path) -> Iterator[Path]:
    ws = prepare_workspace(tmp_path / "creator-ws")
    yield ws
    remove_workspace(ws)


async def test_killed_creator_is_reaped_by_any_worker_but_a_live_one_never(
    engine: SandboxEngine, sandbox_image: str, creator_workspace: Path, docker_client: docker.DockerClient
) -> None:
    other = f"{INSTANCE}-creator"
    proc = subprocess.Popen(
        [sys.executable, "-c", _CREATOR, other, sandbox_image, str(creator_workspace)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        started = [await asyncio.to_thread(proc.stdout.readline) for _ in range(2)]
        assert all(line.strip() for line in started), started
        # Alive: another instance's start on this host (the worker's reap) never touches them.
        removed = await reap(engine, INSTANCE, keep=set())
        assert not [s for s in removed if s.instance == other]
        mine = await list_sandboxes(engine, other)
        assert {line.strip() for line in started} <= {s.id for s in mine}
        assert all(not s.orphaned and s.host for s in mine)
        # Killed in the middle of creating the next one.
        await asyncio.sleep(random.uniform(0, 0.4))  # a random kill point: the scenario
        os.kill(proc.pid, signal.SIGKILL)
        await asyncio.to_thread(proc.wait, 30)
        left = await list_sandboxes(engine, other)
        assert len(left) >= 2 and all(s.orphaned for s in left)
        removed = await reap(engine, INSTANCE, keep=set())
        assert {s.id for s in left} <= {s.id for s in removed}

        # A creation the kill interrupted may still complete in the daemon after that reap: its
        # container has a dead owner too, and the next reap (a worker reaps every few minutes)
        # takes it.
        async def all_reaped() -> bool:
            await reap(engine, INSTANCE, keep=set())
            return await list_sandboxes(engine, other) == []

        await until(all_reaped, timeout=60, what="every sandbox of the killed creator to be reaped")
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait(30)
        for c in docker_client.containers.list(all=True, filters={"label": f"forgehand.instance={other}"}):
            c.remove(force=True)
