"""Merge intents: a merge whose process died after moving the base ref but before its database
commit is finished by reconciliation exactly once (state, merge commit, audit row, `task.merged`);
one whose ref never moved is dropped; an intent still in flight in this process is left alone."""

from collections.abc import Iterator

import httpx
import pygit2
import pytest
from sqlalchemy import func, select

from forge.core.settings import Settings
from forge.db.audit import Actor
from forge.db.engine import Database
from forge.db.events import EventBus
from forge.db.models import AuditEvent
from forge.git import Identity, RepoStore
from forge.git.merge import merge as git_merge
from tasks.core.models import MergeIntent, Task
from tasks.core.states import TaskState
from tasks.services import merge_intents
from tasks.system import TaskSystem
from tests.support.accounts import LiveServer, run_sync
from tests.support.task_world import TASKS, World, agent_commits, bare_repo, build_task_world

pytestmark = pytest.mark.db

ANA = Actor.system("ana")


@pytest.fixture
def world(live_server: LiveServer, settings: Settings) -> Iterator[tuple[str, World]]:
    async def build() -> World:
        db = Database(settings.effective_database_url)
        try:
            return await build_task_world(db, settings)
        finally:
            await db.dispose()

    yield live_server.url, run_sync(build())


def _reviewed_task(url: str, world: World, settings: Settings) -> tuple[int, str]:
    # httpx's default 5 s is shorter than a start can take with the whole suite on two CPUs.
    start = {"goal": "g", "agent": "fixer", "command": "true", "title": "T"}
    r = httpx.post(f"{url}{TASKS}", json=start, headers=world.h("ana"), timeout=60)
    assert r.status_code == 201, r.text
    number = r.json()["number"]

    async def commit() -> str:
        db = Database(settings.effective_database_url)
        try:
            return await agent_commits(db, settings, number, {"new.txt": b"new\n"}, "work")
        finally:
            await db.dispose()

    head = run_sync(commit())
    r = httpx.post(f"{url}{TASKS}/{number}/reviews", json={"verdict": "approve"}, headers=world.h("wendy"), timeout=60)
    assert r.status_code == 201, r.text
    return number, head


async def _crash_between_ref_and_commit(settings: Settings, number: int, head: str, *, move: bool) -> int:
    """What a merging process did before it died: the intent committed, the ref moved (or not)."""
    db = Database(settings.effective_database_url)
    store = RepoStore(settings.data_dir / "repos")
    try:
        async with db.session() as s:
            task = (await s.execute(select(Task).where(Task.number == number))).scalar_one()
            task_id = task.id
        base_sha = str(bare_repo(settings).revparse_single("refs/heads/main").id)
        intent = await merge_intents.record(db, task_id, base_sha, head, "merge", ANA)
        async with db.session(write=True) as s:
            row = await s.get(MergeIntent, intent)
            assert row is not None
            row.owner = row.owner.rsplit(":", 1)[0] + ":999999999"  # a process that is gone
        merge_intents.settled(intent)
        if move:
            who = Identity(name="ana", email="ana@example.org")
            await store.write(
                ("ana", "demo"),
                git_merge,
                base_branch="main",
                head_sha=head,
                strategy="merge",
                expected_base_sha=base_sha,
                author=who,
                message=f"Merge task #{number}\n\nTask-Head: {head}\n",
            )
        return task_id
    finally:
        await store.close()
        await db.dispose()


async def _reconcile(settings: Settings) -> int:
    db = Database(settings.effective_database_url)
    store = RepoStore(settings.data_dir / "repos")
    try:
        return await merge_intents.reconcile(db, TaskSystem(db, settings, store, EventBus()).service)
    finally:
        await store.close()
        await db.dispose()


async def _facts(settings: Settings, task_id: int) -> tuple[str, str | None, int, int]:
    db = Database(settings.effective_database_url)
    try:
        async with db.session() as s:
            task = await s.get(Task, task_id)
            assert task is not None
            audits = (
                await s.execute(select(func.count(AuditEvent.id)).where(AuditEvent.action == "task.merge"))
            ).scalar_one()
            intents = (await s.execute(select(func.count(MergeIntent.id)))).scalar_one()
            return task.state, task.merged_sha, audits, intents
    finally:
        await db.dispose()


def test_a_merge_killed_after_the_ref_moved_is_finished_exactly_once(
    world: tuple[str, World], settings: Settings
) -> None:
    url, w = world
    number, head = _reviewed_task(url, w, settings)
    task_id = run_sync(_crash_between_ref_and_commit(settings, number, head, move=True))
    assert run_sync(_facts(settings, task_id))[0] == TaskState.AWAITING_REVIEW  # the bug: merged in git only
    assert run_sync(_reconcile(settings)) == 1
    state, merged_sha, audits, intents = run_sync(_facts(settings, task_id))
    main = bare_repo(settings).revparse_single("refs/heads/main").peel(pygit2.Commit)
    assert (state, merged_sha, audits, intents) == (TaskState.MERGED, str(main.id), 1, 0)
    assert run_sync(_reconcile(settings)) == 0
    assert run_sync(_facts(settings, task_id))[2] == 1  # never recorded twice


def test_a_merge_killed_before_the_ref_moved_is_dropped(world: tuple[str, World], settings: Settings) -> None:
    url, w = world
    number, head = _reviewed_task(url, w, settings)
    before = str(bare_repo(settings).revparse_single("refs/heads/main").id)
    task_id = run_sync(_crash_between_ref_and_commit(settings, number, head, move=False))
    assert run_sync(_reconcile(settings)) == 0
    assert run_sync(_facts(settings, task_id)) == (TaskState.AWAITING_REVIEW, "", 0, 0)
    assert str(bare_repo(settings).revparse_single("refs/heads/main").id) == before
    r = httpx.post(f"{url}{TASKS}/{number}/merge", json={"strategy": "merge"}, headers=w.h("ana"), timeout=60)
    assert r.status_code in (200, 201), r.text


async def _in_flight(settings: Settings, number: int, head: str) -> tuple[int, int]:
    db = Database(settings.effective_database_url)
    try:
        async with db.session() as s:
            task_id = (await s.execute(select(Task.id).where(Task.number == number))).scalar_one()
        intent = await merge_intents.record(db, task_id, "0" * 40, head, "merge", ANA)
        return task_id, intent
    finally:
        await db.dispose()


def test_an_intent_in_flight_here_is_left_alone(world: tuple[str, World], settings: Settings) -> None:
    url, w = world
    number, head = _reviewed_task(url, w, settings)
    task_id, intent = run_sync(_in_flight(settings, number, head))
    try:
        assert run_sync(_reconcile(settings)) == 0
        assert run_sync(_facts(settings, task_id))[3] == 1
    finally:
        merge_intents.settled(intent)
    assert run_sync(_reconcile(settings)) == 0
    assert run_sync(_facts(settings, task_id))[3] == 0
