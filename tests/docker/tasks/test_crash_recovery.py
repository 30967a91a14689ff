"""Crash recovery against a real `forgehand serve` subprocess, SIGKILLed at random points of pushes
(the git CLI pushing), merges (REST merge of a reviewed task) and running tasks (the command
runtime writing files), restarted each time. After every restart refs, push records, task states,
work-in-progress commits and notifications (outbox rows) agree, and no workspace, quota mount,
container or push quarantine is left. Random but seeded: the same kill points on every run."""

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

import httpx
import msgspec
import pygit2
import pytest
from sqlalchemy import func, select

from forge.core.settings import Settings
from forge.db.engine import Database
from forge.db.models import AuditEvent, PushRecord
from forge.git.ref_locks import STALE_SECONDS as STALE_REF_LOCK_SECONDS
from sandbox import quota_mounts
from tasks.core.models import MergeIntent, Run, Task
from tasks.core.states import RunState, TaskState
from tests.support.accounts import run_sync
from tests.support.git import git
from tests.support.ports import free_port
from tests.support.task_world import TASKS, World, bare_repo, build_task_world
from tests.support.tasks import containers_of
from tests.support.waiting import until_sync
from webhooks.core.models import WebhookOutbox

pytestmark = [pytest.mark.docker, pytest.mark.both_databases]  # its point is what the database keeps

KILLS = 24
SEED = 20261201
FORGEHAND = str(Path(sys.executable).parent / "forgehand")
WRITER = "i=0; while true; do i=$((i+1)); echo $i > w$i.txt; sleep 0.05; done"


def _until(what: str, check: Callable[[], Any], timeout: float = 120.0) -> Any:
    return until_sync(check, timeout=timeout, what=what)


class Server:
    """`forgehand serve` in its own process, on a fixed port across restarts."""

    def __init__(self, settings: Settings, log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("FORGEHAND_")}
        self.env.update(
            {
                "FORGEHAND_DATA_DIR": str(settings.data_dir),
                "FORGEHAND_DATABASE_URL": settings.effective_database_url,
                "FORGEHAND_BASE_URL": self.url,
                "FORGEHAND_HOST": "127.0.0.1",
                "FORGEHAND_PORT": str(self.port),
                "FORGEHAND_RUN_WORKER": "true",
                "FORGEHAND_SEED_DEMO": "false",
                "FORGEHAND_LOG_LEVEL": "warning",
                "FORGEHAND_WEBHOOKS_ALLOWED_HOSTS": "127.0.0.1",
            }
        )
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen([FORGEHAND, "serve"], env=self.env, stdout=out, stderr=subprocess.STDOUT)

        def up() -> bool:
            assert self.proc is not None and self.proc.poll() is None, self.log.read_text()[-3000:]
            try:
                return httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        _until("the server to answer", up, 90)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)


class Crash(msgspec.Struct):
    settings: Settings
    world: World
    server: Server
    clone: Path
    rng: random.Random
    kills: dict[str, int]
    found: list[str]

    def h(self, who: str = "ana") -> dict[str, str]:
        return self.world.h(who)

    def api(self, method: str, path: str, who: str = "ana", **kw: Any) -> httpx.Response:
        return httpx.request(method, f"{self.server.url}{path}", headers=self.h(who), timeout=60, **kw)

    def task(self, number: int) -> dict[str, Any]:
        r = self.api("GET", f"{TASKS}/{number}")
        assert r.status_code == 200, r.text
        body: dict[str, Any] = r.json()
        return body

    def main_sha(self) -> str:
        return str(bare_repo(self.settings).revparse_single("refs/heads/main").id)

    def kill_after(self, delay: float, kind: str) -> None:
        time.sleep(delay)  # the random kill point: the scenario
        self.server.kill()
        self.kills[kind] += 1
        self.server.start()


async def _db_facts(settings: Settings) -> dict[str, Any]:
    db = Database(settings.effective_database_url)
    try:
        async with db.session() as s:

            async def count(stmt: Any) -> int:
                return int((await s.execute(stmt)).scalar_one())

            return {
                "pushes": [p.refs for p in (await s.execute(select(PushRecord).order_by(PushRecord.id))).scalars()],
                "pushed_rows": await count(
                    select(func.count(WebhookOutbox.id)).where(WebhookOutbox.event_type == "repo.pushed")
                ),
                "merged_rows": await count(
                    select(func.count(WebhookOutbox.id)).where(WebhookOutbox.event_type == "task.merged")
                ),
                "merge_audits": await count(select(func.count(AuditEvent.id)).where(AuditEvent.action == "task.merge")),
                "intents": await count(select(func.count(MergeIntent.id))),
                "tasks": [
                    (t.number, t.state, t.head_sha, t.head_is_wip, t.branch, t.merged_sha, t.failure_reason)
                    for t in (await s.execute(select(Task).order_by(Task.number))).scalars()
                ],
                "live_runs": await count(
                    select(func.count(Run.id)).where(Run.state.in_([RunState.QUEUED, RunState.RUNNING]))
                ),
            }
    finally:
        await db.dispose()


def check_agreement(c: Crash) -> None:
    """What must hold after every restart, once nothing runs."""
    facts = run_sync(_db_facts(c.settings))
    repo = bare_repo(c.settings)
    assert facts["intents"] == 0, "a merge intent was left unreconciled"
    # Every push record names refs that are (or were, on main's first-parent line) what git holds.
    main_line = set()
    commit = repo.revparse_single("refs/heads/main").peel(pygit2.Commit)
    while True:
        main_line.add(str(commit.id))
        if not commit.parents:
            break
        commit = commit.parents[0]
    for refs in facts["pushes"]:
        for ref in refs:
            if ref.get("ref") == "refs/heads/main" and ref.get("after"):
                assert ref["after"] in main_line, f"a recorded push is not on main: {ref}"
    assert facts["pushed_rows"] == len(facts["pushes"]), facts
    merged = [t for t in facts["tasks"] if t[1] == TaskState.MERGED]
    assert facts["merged_rows"] == len(merged), facts
    assert facts["merge_audits"] == len(merged), facts
    for number, state, head, _wip, branch, merged_sha, _reason in facts["tasks"]:
        if state == TaskState.MERGED:
            assert merged_sha in main_line, f"task {number} merged as {merged_sha}, not on main"
            continue
        ref = repo.references.get(f"refs/heads/{branch}")
        if ref is not None:
            assert str(ref.target) == head, f"task {number}: branch at {ref.target}, recorded head {head!r}"
        marker = f"\nTask-Head: {head}\n"
        assert not any(marker in repo[sha].message for sha in main_line), f"task {number} merged, recorded {state}"
    assert facts["live_runs"] == 0
    root = c.settings.data_dir / "workspaces"
    assert not root.exists() or not any(root.iterdir()), list(root.rglob("*"))[:10]
    assert not quota_mounts(c.settings.data_dir)
    assert not containers_of(c.settings)
    quarantines = [
        p
        for p in (c.settings.data_dir / "repos").glob("*/*/objects/*")
        if p.name.startswith(("incoming-", "tmp_objdir-"))
    ]
    assert not quarantines, quarantines


def push_cycle(c: Crash, i: int) -> None:
    git("fetch", "-q", "origin", cwd=c.clone)
    git("reset", "-q", "--hard", "origin/main", cwd=c.clone)
    before = c.main_sha()
    (c.clone / f"p{i}.txt").write_text(f"push {i}\n")
    git("add", ".", cwd=c.clone)
    git("commit", "-q", "-m", f"push {i}", cwd=c.clone)
    new = git("rev-parse", "HEAD", cwd=c.clone).stdout.strip()
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0", "HOME": str(c.clone)}
    proc = subprocess.Popen(
        ["git", "push", "-q", "origin", "HEAD:main"],
        cwd=c.clone,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    c.kill_after(c.rng.uniform(0.0, 0.5), "push")
    proc.wait(120)
    after = c.main_sha()
    assert after in (before, new), f"main is at {after}, neither {before} nor {new}"
    facts = run_sync(_db_facts(c.settings))
    recorded = [r for refs in facts["pushes"] for r in refs if r.get("after") == new]
    assert len(recorded) == (1 if after == new else 0), (after == new, recorded)
    c.found.append(f"push {i}: {'landed' if after == new else 'not landed'}")


def _ready_task(c: Crash, i: int) -> int:
    r = c.api("POST", TASKS, json={"goal": "m", "agent": "fixer", "command": f"echo {i} > m{i}.txt", "title": f"m{i}"})
    assert r.status_code == 201, r.text
    number: int = r.json()["number"]
    _until("the task to await review", lambda: c.task(number)["state"] == "awaiting_review")
    r = c.api("POST", f"{TASKS}/{number}/reviews", "wendy", json={"verdict": "approve"})
    assert r.status_code == 201, r.text
    return number


def merge_cycle(c: Crash, i: int) -> None:
    number = _ready_task(c, i)
    head = c.task(number)["head_sha"]
    strategy = c.rng.choice(["merge", "squash"])

    def merge() -> None:
        with contextlib.suppress(httpx.HTTPError):  # the server died under it
            c.api("POST", f"{TASKS}/{number}/merge", json={"strategy": strategy})

    caller = threading.Thread(target=merge)
    caller.start()
    c.kill_after(c.rng.uniform(0.0, 0.3), "merge")
    caller.join(90)
    state = c.task(number)["state"]
    assert state in ("merged", "awaiting_review"), state
    if state == "awaiting_review":
        c.found.append(f"merge {i}: not landed, rolled back")
        # Killed while it held main's lock file, the merge left it behind: "being updated by
        # someone else" until it is older than any live update holds one, then the retry lands.
        tried: list[httpx.Response] = []

        def retried() -> bool:
            r = c.api("POST", f"{TASKS}/{number}/merge", json={"strategy": strategy, "expected_head_sha": head})
            tried.append(r)
            return r.status_code != 409 or r.json().get("code") != "base_moved"

        until_sync(
            retried,
            timeout=STALE_REF_LOCK_SECONDS + 20,
            interval=1,
            what="the merge retry past the stale lock",
            show=lambda: tried[-1].text,
        )
        r = tried[-1]
        assert r.status_code in (200, 201), r.text
    else:
        c.found.append(f"merge {i}: landed")
    assert c.task(number)["state"] == "merged"


def _seen_files(c: Crash) -> set[str]:
    return {p.name for p in (c.settings.data_dir / "workspaces").glob("*/*/w*.txt")}


def run_cycle(c: Crash, i: int) -> None:
    r = c.api("POST", TASKS, json={"goal": "w", "agent": "fixer", "command": WRITER, "title": f"w{i}"})
    assert r.status_code == 201, r.text
    number = r.json()["number"]
    time.sleep(c.rng.uniform(0.0, 4.0))  # the random kill point (not an assertion)
    seen = _seen_files(c)
    c.kill_after(0, "run")

    def settled() -> bool:
        state = c.task(number)["state"]
        if state in ("queued", "running"):
            c.api("POST", f"{TASKS}/{number}/stop")  # claimed again by the new server: stop it
            return False
        return True

    _until("the run to settle", settled)
    facts = run_sync(_db_facts(c.settings))
    [(_, state, head, wip, _branch, _, reason)] = [t for t in facts["tasks"] if t[0] == number]
    if seen:
        tree = bare_repo(c.settings).revparse_single(head).peel(pygit2.Commit).tree
        names = {e.name for e in tree}
        assert seen <= names, f"work lost: {sorted(seen - names)[:5]}"
        assert wip, "the salvaged work is not marked work in progress"
        c.found.append(f"run {i}: {len(seen)} files seen, {len(names)} committed, {state}/{reason}")
    else:
        c.found.append(f"run {i}: killed before any file, {state}/{reason}")


@pytest.fixture
def crash(settings: Settings, sandbox_image: str, tmp_path: Path) -> Iterator[Crash]:
    s = msgspec.structs.replace(settings, run_worker=True)
    world = run_sync(build_task_world(Database(s.effective_database_url), s))
    server = Server(s, tmp_path / "serve.log")
    server.start()
    try:
        # A notify endpoint (nothing listens: rows stay to be counted) for what must agree.
        hook = {"url": "http://127.0.0.1:9/hook", "kind": "notify", "events": ["repo.pushed", "task.merged"]}
        r = httpx.post(f"{server.url}/api/v1/repos/ana/demo/hooks", json=hook, headers=world.h("ana"), timeout=30)
        assert r.status_code == 201, r.text
        host = server.url.removeprefix("http://")
        clone = tmp_path / "clone"
        git("clone", "-q", f"http://ana:{world.tokens['ana']}@{host}/ana/demo.git", str(clone), cwd=tmp_path)
        yield Crash(
            settings=s,
            world=world,
            server=server,
            clone=clone,
            rng=random.Random(SEED),
            kills={"push": 0, "merge": 0, "run": 0},
            found=[],
        )
    finally:
        if server.proc is not None and server.proc.poll() is None:
            server.proc.send_signal(signal.SIGTERM)
            try:
                server.proc.wait(60)
            except subprocess.TimeoutExpired:
                server.proc.kill()


CYCLES = {"push": push_cycle, "merge": merge_cycle, "run": run_cycle}


@pytest.mark.parametrize("kind", list(CYCLES))
def test_sigkill_at_random_points_loses_nothing(crash: Crash, kind: str) -> None:
    """KILLS / 3 kills of one kind (push, merge, run), each followed by a restart and the agreement
    check: about a minute each, the point being the number of random kill points. One test per kind
    so parallel workers share the 24 kills."""
    crash.rng.seed(f"{SEED}-{kind}")
    cycle = CYCLES[kind]
    for i in range(KILLS // len(CYCLES)):
        cycle(crash, i)
        check_agreement(crash)
    assert crash.kills[kind] == KILLS // len(CYCLES)
    print("kills:", crash.kills, "\n" + "\n".join(crash.found))
