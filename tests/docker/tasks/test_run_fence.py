"""A worker that stalls past its lease in the middle of its snapshot, against the real engine and
real git: another worker (a host of its own, which cannot see this one's workspaces) takes the run
over and records it `interrupted` with the branch as it found it; when the stalled worker wakes,
its branch move is refused by the run's git fence, so the task branch and the task's head agree,
the run is recorded once, and the stalled worker writes nothing more.

The stall is made exact: the snapshot's ref update (the last step before the branch moves) first
waits for the other worker's recovery to finish. Without the fence the branch would move after the
takeover and be ahead of what the task records."""

import asyncio
import dataclasses
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pygit2
import pytest

from forge.core.settings import Settings
from forge.git import RepoStore, fences
from forge.git.bare import update_ref as real_update_ref
from forge.git.errors import Fenced
from tasks.run import recovery
from tasks.run.env import RunEnv
from tasks.run.settle import Settling
from tests.support.tasks import Env, all_events, serve_env, start, tree_files, wait_state, wait_task
from tests.support.waiting import until

pytestmark = pytest.mark.docker


@pytest.fixture
def env(settings: Settings, sandbox_image: str) -> Iterator[Env]:
    yield from serve_env(settings)


class Stall:
    """What the stalled worker's snapshot saw, and the takeover made while it waited."""

    def __init__(self) -> None:
        self.run_env: RunEnv | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.run_uuid = ""
        self.took_over = False
        self.refused: BaseException | None = None
        self.ended = False  # the stalled worker's ref update is over (after the takeover)


async def take_over(worker: RunEnv, elsewhere: Path | None) -> None:
    """Another worker's recovery pass: its own id and git store (the same repositories), and its
    own data directory (`elsewhere`; None: the same, shared storage), as a worker on another host
    sees the stalled one once its lease lapsed."""
    other_settings = msgspec.structs.replace(worker.settings, data_dir=elsewhere or worker.settings.data_dir)
    store = RepoStore(worker.store.root)
    other = dataclasses.replace(
        worker, worker_id=f"elsewhere:1:{secrets.token_hex(4)}", settings=other_settings, store=store
    )
    recovery.worker_stopped(worker.worker_id)  # what a lapsed lease tells the other worker
    try:
        await recovery.recover(other, reap_containers=False)
    finally:
        recovery.worker_started(worker.worker_id)
        await store.close()


@pytest.fixture
def stalled(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Stall:
    stall = Stall()
    real_snapshot = Settling._snapshot

    async def snapshot(self: Settling, *args: Any, **kw: Any) -> Any:
        stall.run_env, stall.loop, stall.run_uuid = self.env, asyncio.get_running_loop(), self.run_uuid
        return await real_snapshot(self, *args, **kw)

    def update_ref(repo: pygit2.Repository, ref: str, new: str | None, **kw: Any) -> None:
        if kw.get("fence") and not stall.took_over:
            # The stall: the tree is built and the branch read; the lease lapses now.
            assert stall.run_env is not None and stall.loop is not None
            done = asyncio.run_coroutine_threadsafe(take_over(stall.run_env, tmp_path / "elsewhere"), stall.loop)
            done.result(timeout=120)
            stall.took_over = True
        try:
            real_update_ref(repo, ref, new, **kw)
        except BaseException as exc:
            stall.refused = exc
            raise
        finally:
            stall.ended = stall.took_over

    monkeypatch.setattr(Settling, "_snapshot", snapshot)
    monkeypatch.setattr("forge.git.snapshot.update_ref", update_ref)
    return stall


async def test_a_stalled_worker_cannot_move_the_branch_after_the_takeover(env: Env, stalled: Stall) -> None:
    async with env.client() as c:
        await start(c, "echo late > late.txt")
        task = await wait_state(c, 1, "failed", "awaiting_review")
    # The takeover is recorded before the stalled worker's ref update resumes: wait for that.
    await until(lambda: stalled.ended, timeout=60, what="the stalled worker's ref update to end")
    assert stalled.took_over, "the snapshot never reached its ref update"
    # The stalled worker's branch move was refused by the fence, under its lock.
    assert isinstance(stalled.refused, Fenced), stalled.refused
    repo = pygit2.Repository(str(env.repo_path))
    assert fences.state(repo, stalled.run_uuid) == "revoked"

    # The takeover's record stands: interrupted, and the task's head is what the branch holds
    # (no branch at all: the other worker found no workspace to snapshot, and nothing moved it).
    assert task["state"] == "failed" and task["failure_reason"] == "interrupted", task
    [run] = task["runs"]
    assert run["state"] == "failed" and run["failure_reason"] == "interrupted", run
    assert repo.references.get(f"refs/heads/{task['branch']}") is None
    assert task["head_sha"] in ("", task["base_sha"]), task

    # Recorded once, by the takeover: no snapshot event from the stalled worker.
    async with env.client() as c:
        events = await all_events(c, 1)
    interrupted = [e for e in events if e["kind"] == "notice" and e["payload"]["text"] == recovery.INTERRUPTED]
    assert len(interrupted) == 1, events
    assert not [e for e in events if e["kind"] == "system" and e["payload"].get("phase") == "snapshot"], events


async def test_a_run_that_ends_itself_removes_its_fence(env: Env) -> None:
    async with env.client() as c:
        task = await start(c, "echo ok > ok.txt")
        done = await wait_state(c, task["number"], "awaiting_review", "failed")
    assert done["state"] == "awaiting_review", done
    repo = pygit2.Repository(str(env.repo_path))
    # No fence is left behind by a run that settled itself, and the branch holds the commit.
    assert [r for r in repo.references if r.startswith(fences.NAMESPACE)] == []
    assert str(repo.references[f"refs/heads/{done['branch']}"].target) == done["head_sha"]


class Overlap:
    """A takeover that starts as the stalled worker comes to record its run."""

    def __init__(self) -> None:
        self.taken = asyncio.Event()  # the taker has the run (its salvage is about to start)
        self.recorded = asyncio.Event()  # the stalled worker's attempt to record is over
        self.workspace_there: bool | None = None  # what the taker's salvage found
        self.taker: asyncio.Task[None] | None = None


@pytest.fixture
def overlap(monkeypatch: pytest.MonkeyPatch) -> Overlap:
    seen = Overlap()
    real_finish = Settling.finish_in_db
    real_salvage = recovery.salvage

    async def finish_in_db(self: Settling, *args: Any, **kw: Any) -> None:
        # The snapshot has landed; the lease lapses now: a worker sharing the storage takes the
        # run over before this one records it.
        seen.taker = asyncio.create_task(take_over(self.env, None))
        await asyncio.wait_for(seen.taken.wait(), 60)
        try:
            await real_finish(self, *args, **kw)
        finally:
            seen.recorded.set()

    async def salvage(env: RunEnv, run: Any, task: Any, *args: Any) -> recovery.Salvage:
        seen.taken.set()
        await asyncio.wait_for(seen.recorded.wait(), 60)
        seen.workspace_there = recovery.workspace_of(env, task.uuid, run.uuid).is_dir()
        return await real_salvage(env, run, task, *args)

    monkeypatch.setattr(Settling, "finish_in_db", finish_in_db)
    monkeypatch.setattr(recovery, "salvage", salvage)
    return seen


async def test_a_stalled_worker_records_nothing_once_taken_and_leaves_the_workspace(env: Env, overlap: Overlap) -> None:
    async with env.client() as c:
        await start(c, "echo kept > kept.txt")
        task = await wait_task(
            c, 1, lambda t: t["state"] in ("failed", "awaiting_review") and t["head_sha"], what="the takeover"
        )
    assert overlap.taker is not None
    # The stalled worker's record was refused (the run was the taker's), and it left the workspace
    # for the taker, whose salvage found it.
    assert overlap.workspace_there is True
    assert task["state"] == "failed" and task["failure_reason"] == "interrupted", task
    # Its snapshot had landed before the takeover: the work is kept, as the task's head, and the
    # run still names the worker that ran it.
    repo = pygit2.Repository(str(env.repo_path))
    assert str(repo.references[f"refs/heads/{task['branch']}"].target) == task["head_sha"] != task["base_sha"]
    assert tree_files(env.repo_path, task["head_sha"])["kept.txt"] == (0o100644, b"kept\n")
    [run] = task["runs"]
    assert run["state"] == "failed" and not run["worker"].startswith("elsewhere:"), run
    assert recovery.RECOVERING not in run["worker"]
