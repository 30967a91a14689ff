"""Merge against a real server while the base moves: a real `git push` lands while the merge waits
for its `pre_merge` policy hook (the merge must lose cleanly, the push must survive), a stale
clone pushed after a merge (the push loses), and the two racing from threads (never an overwrite).
Also the `pre_merge` hook denying with a reason. Real git CLI, real HTTP, real policy consumer."""

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pygit2
import pytest

from forge.core.settings import Settings
from forge.db.engine import Database
from tests.support.accounts import LiveServer, run_sync
from tests.support.git import git
from tests.support.policy import PolicyConsumer
from tests.support.task_world import TASKS, World, agent_commits, build_task_world

pytestmark = pytest.mark.db


@pytest.fixture
def settings(settings: Settings) -> Settings:
    # Loopback policy consumers are allowed here, and the consumer that pushes before it answers
    # (a real `git push` to this server) gets the longest deadline an operator can give it.
    return msgspec.structs.replace(settings, webhooks_allowed_hosts="127.0.0.1", webhooks_policy_deadline_seconds=10.0)


class Consumer(PolicyConsumer):
    """A policy endpoint whose answer to `pre_merge` is a callback (it may act before answering)."""

    def __init__(self) -> None:
        self.on_merge: Callable[[dict[str, Any]], dict[str, Any] | None] = lambda body: None
        super().__init__()

    def answer(self, body: dict[str, Any]) -> tuple[int, dict[str, Any] | None]:
        return 200, self.on_merge(body) if body["type"] == "pre_merge" else None


class Env(msgspec.Struct):
    url: str
    world: World
    settings: Settings

    def post(self, path: str, who: str, body: dict[str, Any]) -> httpx.Response:
        return httpx.post(f"{self.url}{path}", json=body, headers=self.world.h(who), timeout=60)

    def main_sha(self) -> str:
        repo = pygit2.Repository(str(self.settings.data_dir / "repos" / "ana" / "demo.git"))
        return str(repo.revparse_single("refs/heads/main").id)

    def is_ancestor(self, older: str, newer: str) -> bool:
        repo = pygit2.Repository(str(self.settings.data_dir / "repos" / "ana" / "demo.git"))
        return older == newer or repo.descendant_of(newer, older)


async def _with_db(settings: Settings, fn: Callable[[Database], Any]) -> Any:
    db = Database(settings.effective_database_url)
    try:
        return await fn(db)
    finally:
        await db.dispose()


@pytest.fixture
def env(live_server: LiveServer, settings: Settings) -> Iterator[Env]:
    world = run_sync(_with_db(settings, lambda db: build_task_world(db, settings)))
    yield Env(url=live_server.url, world=world, settings=settings)


def _ready_task(env: Env, files: dict[str, bytes]) -> str:
    r = env.post(TASKS, "ana", {"goal": "work", "agent": "fixer", "command": "true", "title": "Work"})
    assert r.status_code == 201, r.text
    number = r.json()["number"]
    head = run_sync(_with_db(env.settings, lambda db: agent_commits(db, env.settings, number, files, "work")))
    r = env.post(f"{TASKS}/{number}/reviews", "wendy", {"verdict": "approve"})
    assert r.status_code == 201, r.text
    return head


def _clone_with_commit(env: Env, tmp: Path, name: str) -> Path:
    """A clone of ana/demo with one new commit on main, ready to push."""
    host = env.url.removeprefix("http://")
    url = f"http://ana:{env.world.tokens['ana']}@{host}/ana/demo.git"
    work = tmp / name
    git("clone", "-q", url, str(work), cwd=tmp)
    (work / f"{name}.txt").write_text(f"{name}\n")
    git("add", ".", cwd=work)
    git("commit", "-q", "-m", f"push {name}", cwd=work)
    return work


def test_a_push_during_the_merge_wins_and_the_merge_retries_cleanly(env: Env, tmp_path: Path) -> None:
    consumer = Consumer()
    r = env.post(
        "/api/v1/repos/ana/demo/hooks", "ana", {"url": consumer.url, "kind": "policy", "events": ["pre_merge"]}
    )
    assert r.status_code == 201, r.text
    head = _ready_task(env, {"feature.txt": b"feature\n"})
    clone = _clone_with_commit(env, tmp_path, "pushed")
    pushed = git("rev-parse", "HEAD", cwd=clone).stdout.strip()

    def push_then_allow(body: dict[str, Any]) -> None:
        # The merge is planned and waits for this answer: the base moves under it now.
        git("push", "-q", "origin", "main", cwd=clone)
        return

    consumer.on_merge = push_then_allow
    r = env.post(f"{TASKS}/1/merge", "ana", {"expected_head_sha": head})
    assert r.status_code == 409 and r.json()["code"] == "base_moved", r.text
    assert env.main_sha() == pushed  # the push was not overwritten
    assert httpx.get(f"{env.url}{TASKS}/1", headers=env.world.h("ana"), timeout=60).json()["state"] == "awaiting_review"
    [asked] = [b for b in consumer.seen if b["type"] == "pre_merge"]
    assert asked["data"]["head_sha"] == head and asked["data"]["approvals"] == ["wendy"]
    assert asked["data"]["strategy"] == "merge" and asked["data"]["diffstat"]["files"] == 1

    consumer.on_merge = lambda body: {"permission": {"decision": "deny", "reason": "freeze until Monday"}}
    r = env.post(f"{TASKS}/1/merge", "ana", {"expected_head_sha": head})
    assert r.status_code == 403 and r.json()["code"] == "policy_denied", r.text
    assert "freeze until Monday" in r.json()["detail"]
    assert env.main_sha() == pushed

    consumer.on_merge = lambda body: None
    r = env.post(f"{TASKS}/1/merge", "ana", {"expected_head_sha": head})
    assert r.status_code == 200, r.text
    merged = r.json()["merged_sha"]
    assert env.main_sha() == merged and env.is_ancestor(pushed, merged) and env.is_ancestor(head, merged)


def test_a_stale_push_after_a_merge_is_refused(env: Env, tmp_path: Path) -> None:
    head = _ready_task(env, {"feature.txt": b"feature\n"})
    clone = _clone_with_commit(env, tmp_path, "late")
    r = env.post(f"{TASKS}/1/merge", "ana", {"strategy": "squash", "expected_head_sha": head})
    assert r.status_code == 200, r.text
    merged = r.json()["merged_sha"]
    late = git("push", "-q", "origin", "main", cwd=clone, check=False)
    assert late.returncode != 0 and ("rejected" in late.stderr or "non-fast-forward" in late.stderr), late.stderr
    assert env.main_sha() == merged


def test_merge_and_push_racing_never_overwrite_each_other(env: Env, tmp_path: Path) -> None:
    head = _ready_task(env, {"feature.txt": b"feature\n"})
    clone = _clone_with_commit(env, tmp_path, "racer")
    pushed = git("rev-parse", "HEAD", cwd=clone).stdout.strip()
    start = threading.Barrier(2)
    results: dict[str, Any] = {}

    def do_merge() -> None:
        start.wait()
        results["merge"] = env.post(f"{TASKS}/1/merge", "ana", {"expected_head_sha": head})

    def do_push() -> None:
        start.wait()
        results["push"] = git("push", "-q", "origin", "main", cwd=clone, check=False)

    threads = [threading.Thread(target=do_merge), threading.Thread(target=do_push)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    merge, push = results["merge"], results["push"]
    assert merge.status_code in (200, 409), merge.text
    assert merge.status_code == 200 or merge.json()["code"] == "base_moved"
    assert push.returncode == 0 or merge.status_code == 200, push.stderr
    tip = env.main_sha()
    if push.returncode == 0:
        assert env.is_ancestor(pushed, tip)  # a push that succeeded is never lost
    if merge.status_code == 200:
        assert env.is_ancestor(merge.json()["merged_sha"], tip) and env.is_ancestor(head, tip)
    else:  # the merge lost: it goes through on the next attempt, on top of the push
        r = env.post(f"{TASKS}/1/merge", "ana", {"expected_head_sha": head})
        assert r.status_code == 200, r.text
        assert env.is_ancestor(pushed, env.main_sha())
