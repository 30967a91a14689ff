"""Tasks end to end against the real engine, real git and a real HTTP server: the `command` runtime."""

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pygit2
import pytest

from forge.core.settings import Settings
from forge.db.audit import Actor
from forge.db.engine import Database
from forge.db.events import EventBus
from forge.git import RepoStore
from tasks.core.live import LiveHub
from tasks.core.policy import AllowAll
from tasks.run.warm import LABEL_WORKER
from tasks.run.worker import TaskWorker
from tests.support.tasks import (
    SECRET,
    Env,
    all_events,
    containers_of,
    output_text,
    seed,
    serve,
    serve_env,
    start,
    task_settings,
    tree_files,
    wait_state,
    wait_task,
)
from tests.support.waiting import until

pytestmark = pytest.mark.docker

SYSTEM = Actor.system("test")


@pytest.fixture
def env(settings: Settings, sandbox_image: str) -> Iterator[Env]:
    yield from serve_env(settings)


async def test_command_task_commits_exactly_the_work_tree(env: Env) -> None:
    async with env.client() as c:
        script = "echo more >> run.sh && mkdir -p src && printf 'new' > src/new.txt && rm old.txt && echo done"
        task = await start(c, script)
        assert task["number"] == 1 and task["state"] == "queued" and task["queue_position"] == 1
        assert task["branch"].startswith("agent/1-")
        done = await wait_state(c, 1, "awaiting_review", "failed")
        assert done["state"] == "awaiting_review", done
        assert done["runs"][0]["state"] == "succeeded" and done["runs"][0]["exit_code"] == 0
        files = tree_files(env.repo_path, done["head_sha"])
        assert files == {
            "README.md": (0o100644, b"# demo\n"),
            "lib/keep.py": (0o100644, b"print('keep')\n"),
            "run.sh": (0o100755, b"#!/bin/sh\necho hi\nmore\n"),
            "src/new.txt": (0o100644, b"new"),
        }
        repo = pygit2.Repository(str(env.repo_path))
        ref = repo.references[f"refs/heads/{done['branch']}"]
        commit = repo[ref.target].peel(pygit2.Commit)
        assert str(commit.id) == done["head_sha"] and commit.author.name == "fixer"
        assert str(commit.parents[0].id) == done["base_sha"] and not done["head_is_wip"]
        # The run reports on its commit as a CI system would: forgehand/task, linking the task.
        status = (await c.get(f"/api/v1/repos/ana/demo/commits/{done['head_sha']}/status")).json()
        assert status["state"] == "success", status
        [check] = status["statuses"]
        assert check["context"] == "forgehand/task" and check["description"] == "run 1 succeeded"
        assert check["target_url"] == f"{env.url}/ana/demo/tasks/1" and check["creator"]["login"] == "fixer"
        events = await all_events(c, 1)
        seqs = [e["seq"] for e in events]
        assert seqs == list(range(1, len(seqs) + 1))
        assert "done" in output_text(events)
        phases = [e["payload"]["phase"] for e in events if e["kind"] == "system"]
        assert {"workspace", "sandbox", "runtime", "snapshot"} <= set(phases)
        assert all(e["schema_version"] == 1 for e in events)
        assert not containers_of(env.settings)


async def test_sandbox_escapes_never_reach_the_commit_and_secrets_are_redacted(env: Env) -> None:
    half = len(SECRET) // 2
    script = (
        "ln -s /etc/passwd passwd-link && mkdir -p .git/hooks && echo evil > .git/hooks/pre-commit"
        " && truncate -s 1G big.bin && ln -s ../../outside escape && echo ok > fine.txt && ln -s fine.txt good-link"
        f" && printf 'key={SECRET[:half]}' && sleep 1 && printf '{SECRET[half:]} end\\n'"
        f" && echo '{SECRET}' >&2"
    )
    async with env.client() as c:
        await start(c, script)
        done = await wait_state(c, 1, "awaiting_review", "failed")
        assert done["state"] == "awaiting_review", done
        files = tree_files(env.repo_path, done["head_sha"])
        assert files["fine.txt"] == (0o100644, b"ok\n")
        assert files["good-link"] == (0o120000, b"fine.txt")
        for bad in ("passwd-link", "big.bin", "escape", ".git/hooks/pre-commit"):
            assert bad not in files
        skipped = {s["path"] for s in done["runs"][0]["skipped"]}
        assert {"passwd-link", "big.bin", "escape", ".git"} <= skipped
        events = await all_events(c, 1)
        raw = msgspec.json.encode(events).decode()
        assert SECRET not in raw
        assert SECRET[:half] not in output_text(events)  # the split secret was caught across two chunks
        assert "key=[REDACTED] end" in output_text(events)
        assert "[REDACTED]" in output_text(events, "stderr")


async def printed(c: httpx.AsyncClient, text: str) -> bool:
    """Whether task 1's output holds `text`."""
    return text in output_text(await all_events(c, 1))


async def test_stop_kills_the_sandbox_then_retry_continues_from_the_wip_snapshot(env: Env) -> None:
    script = "if [ -f marker ]; then echo second; else touch marker; echo first; sleep 300; fi"
    async with env.client() as c:
        await start(c, script)
        await until(lambda: printed(c, "first"), timeout=120, what="the first run to print 'first'")
        # The run names its worker, as do its sandbox's label and the transcript's claim.
        worker = (await c.get("/api/v1/repos/ana/demo/tasks/1")).json()["runs"][0]["worker"]
        assert worker and [x.labels.get(LABEL_WORKER) for x in containers_of(env.settings)] == [worker]
        [claimed] = [e["payload"] for e in await all_events(c, 1) if e["payload"].get("phase") == "claimed"]
        assert claimed["detail"] == {"worker": worker} and claimed["text"].endswith(f"claimed by worker {worker}")
        t0 = time.monotonic()
        r = await c.post("/api/v1/repos/ana/demo/tasks/1/stop")
        assert r.status_code == 200, r.text
        stopped = r.json()
        assert stopped["state"] == "stopped" and time.monotonic() - t0 < 30
        assert not containers_of(env.settings)  # done only when the container is gone
        assert stopped["runs"][0]["state"] == "stopped"
        assert stopped["head_is_wip"] and "marker" in tree_files(env.repo_path, stopped["head_sha"])
        again = await c.post("/api/v1/repos/ana/demo/tasks/1/stop")
        assert again.status_code == 200 and again.json()["state"] == "stopped"  # idempotent
        r = await c.post("/api/v1/repos/ana/demo/tasks/1/retry")
        assert r.status_code == 200 and r.json()["state"] == "queued", r.text
        done = await wait_state(c, 1, "awaiting_review", "failed")
        assert done["state"] == "awaiting_review", done
        assert [run["kind"] for run in done["runs"]] == ["start", "retry"]
        assert "second" in output_text(await all_events(c, 1))


async def test_message_while_running_is_queued_and_delivered(env: Env) -> None:
    script = 'sleep 3; printf "%s" "$FORGEHAND_PROMPT" > prompt.txt'
    async with env.client() as c:
        await start(c, script)
        await wait_state(c, 1, "running")
        r = await c.post("/api/v1/repos/ana/demo/tasks/1/messages", json={"body": "also do this"})
        assert r.status_code == 200, r.text
        assert r.json()["queued_message"] == "also do this" and r.json()["state"] == "running"
        body = await wait_task(
            c,
            1,
            lambda t: len(t["runs"]) == 2 and t["state"] == "awaiting_review",
            what="the message's run to end in review",
        )
        assert [run["kind"] for run in body["runs"]] == ["start", "message"]
        assert body["queued_message"] == ""
        assert tree_files(env.repo_path, body["head_sha"])["prompt.txt"] == (0o100644, b"also do this")


async def test_failing_command_is_failed_with_a_reason(env: Env) -> None:
    async with env.client() as c:
        await start(c, ["bash", "-c", "echo partial > wip.txt; exit 3"])
        done = await wait_state(c, 1, "failed", "awaiting_review")
        assert done["state"] == "failed" and done["failure_reason"] == "exit_code"
        assert "status 3" in done["error"] and done["runs"][0]["exit_code"] == 3
        assert done["head_is_wip"] and "wip.txt" in tree_files(env.repo_path, done["head_sha"])
        status = (await c.get(f"/api/v1/repos/ana/demo/commits/{done['head_sha']}/status")).json()
        assert status["state"] == "failure"
        assert [(s["context"], s["state"], s["description"]) for s in status["statuses"]] == [
            ("forgehand/task", "failure", "run 1 failed: exit_code")
        ]


@pytest.fixture
def worker_env(settings: Settings, sandbox_image: str) -> Iterator[tuple[Settings, str]]:
    s = task_settings(settings, run_worker=False)
    token, _ = asyncio.run(seed(s))
    yield s, token


@pytest.mark.both_databases  # recovery / one writer wins: each database's own locking
async def test_worker_killed_mid_run_then_restarted(worker_env: tuple[Settings, str]) -> None:
    settings, token = worker_env
    env_vars = {
        **os.environ,
        "FORGEHAND_DATA_DIR": str(settings.data_dir),
        "FORGEHAND_DATABASE_URL": settings.effective_database_url,
        "FORGEHAND_BASE_URL": settings.effective_base_url,
        "FORGEHAND_LOG_LEVEL": "warning",
    }
    proc = subprocess.Popen([str(Path(sys.executable).parent / "forgehand"), "worker"], env=env_vars)
    try:
        for url in serve(settings):
            async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60) as c:
                await start(c, "echo started; sleep 300")
                await wait_state(c, 1, "running")
                await until(lambda: printed(c, "started"), timeout=60, what="the run to print 'started'")
                assert containers_of(settings)
                proc.send_signal(signal.SIGKILL)
                proc.wait(10)
                assert (await c.get("/api/v1/repos/ana/demo/tasks/1")).json()["state"] == "running"
                db = Database(settings.effective_database_url)
                store = RepoStore(settings.data_dir / "repos")
                worker = TaskWorker(db, settings, store, EventBus(), LiveHub(), AllowAll())
                await worker.start()
                try:
                    body = (await c.get("/api/v1/repos/ana/demo/tasks/1")).json()
                    assert body["state"] == "failed" and body["failure_reason"] == "interrupted", body
                    assert body["runs"][0]["failure_reason"] == "interrupted"
                    assert not containers_of(settings)
                finally:
                    await worker.close()
                    await db.dispose()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def test_event_stream_announces_the_state_live_then_ends(env: Env) -> None:
    async with env.client() as c:
        task = await start(c, "sleep 1; echo done")
        frames: list[tuple[str, Any]] = []
        async with c.stream("GET", f"/api/v1/repos/ana/demo/tasks/{task['number']}/events") as r:
            assert r.status_code == 200
            event, data = "message", ""
            async for line in r.aiter_lines():
                if line == "":
                    if data:
                        frames.append((event, json.loads(data)))
                        if event == "end":
                            break
                    event, data = "message", ""
                elif line.startswith("event:"):
                    event = line[6:].strip()
                elif line.startswith("data:"):
                    data += line[5:].strip()
    states = [d["state"] for e, d in frames if e == "state"]
    assert states and states[-1] == "running" and states == list(dict.fromkeys(states)), states
    assert frames[-1] == ("end", {"state": "awaiting_review", "last_seq": frames[-2][1]["seq"]})
    assert any(e == "stdout" and "done" in d["payload"]["text"] for e, d in frames)


async def test_the_task_branch_keeps_what_the_agent_did_not_touch(env: Env) -> None:
    repo = pygit2.Repository(str(env.repo_path))
    head = repo.references["refs/heads/main"].peel(pygit2.Commit)
    builder = repo.TreeBuilder(head.tree)
    big = repo.create_blob(b"x" * (env.settings.task_max_file_bytes + 1))
    builder.insert("big.bin", big, pygit2.enums.FileMode.BLOB)
    builder.insert("abs-link", repo.create_blob(b"/etc/passwd"), pygit2.enums.FileMode.LINK)
    builder.insert("vendor", pygit2.Oid(hex="12" * 20), pygit2.enums.FileMode.COMMIT)
    sig = pygit2.Signature("ana", "ana@example.com")
    repo.create_commit("refs/heads/main", sig, sig, "odd base", builder.write(), [head.id])
    async with env.client() as c:
        await start(c, "echo one > new.txt")
        done = await wait_state(c, 1, "awaiting_review", "failed")
        assert done["state"] == "awaiting_review", done
        assert done["runs"][0]["skipped"] == []
    new = repo[done["head_sha"]].peel(pygit2.Commit)
    diff = new.tree.diff_to_tree(repo[done["base_sha"]].peel(pygit2.Commit).tree, swap=True)
    assert [d.new_file.path for d in diff.deltas] == ["new.txt"]


async def test_a_change_over_the_file_cap_fails_the_run_as_snapshot_too_large(env: Env) -> None:
    async with env.client() as c:
        await start(c, "mkdir many && cd many && seq 1 50001 | xargs touch")
        done = await wait_state(c, 1, "failed", "awaiting_review", timeout=300)
        assert done["state"] == "failed" and done["failure_reason"] == "snapshot_too_large", done
        assert done["head_sha"] in (None, "", done["base_sha"])


async def test_a_snapshot_that_cannot_be_written_fails_the_run(env: Env) -> None:
    objects = env.repo_path / "objects"
    async with env.client() as c:
        await start(c, "sleep 3; echo one > new.txt")

        async def runtime_started() -> bool:
            return "runtime" in {e["payload"].get("phase") for e in await all_events(c, 1) if e["kind"] == "system"}

        await until(runtime_started, timeout=120, what="the runtime to start")
        objects.rename(env.repo_path / "objects.away")
        objects.write_text("")  # the object store is gone: nothing can be read or written
        try:
            done = await wait_state(c, 1, "failed", "awaiting_review")
        finally:
            objects.unlink()
            (env.repo_path / "objects.away").rename(objects)
        assert done["state"] == "failed" and done["failure_reason"] == "snapshot_failed", done
        assert "snapshot" in done["error"]
