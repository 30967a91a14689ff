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

import docker
import httpx
import msgspec
import pygit2
import pytest

from forge import accounts, repo_collaborators, repo_lifecycle, repositories, tokens
from forge.audit import Actor
from forge.db import Database
from forge.events import EventBus
from forge.git import Identity, RepoStore
from forge.git.bare import write_commit
from forge.settings import Settings
from tasks.live import LiveHub
from tasks.policy import AllowAll
from tasks.worker import TaskWorker

pytestmark = pytest.mark.docker

SECRET = "sk-live-0123456789abcdefXYZ"
SYSTEM = Actor.system("test")


class Env(msgspec.Struct):
    url: str
    settings: Settings
    token: str
    repo_path: Path

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=self.url, headers={"Authorization": f"Bearer {self.token}"}, timeout=httpx.Timeout(120)
        )


async def seed(settings: Settings) -> tuple[str, Path]:
    db = Database(settings.effective_database_url)
    store = RepoStore(settings.data_dir / "repos")
    try:
        async with db.session(write=True) as s:
            ana = await accounts.create_user(s, SYSTEM, "ana", "correct horse battery")
            await accounts.create_bot(s, SYSTEM, "fixer")
            repo = await repo_lifecycle.create(s, store, EventBus(), SYSTEM, ana, "demo", auto_init=True)
            res = await repositories.resource_for(s, repo, SYSTEM.principal)
            await repo_collaborators.set_collaborator(s, SYSTEM, res, "fixer", "write")
            created = await tokens.create(s, SYSTEM, ana, "t", ["repo:write", "tasks:write", "reviews:write"], None)
        await store.write(
            ("ana", "demo"),
            write_commit,
            branch="main",
            files={"old.txt": b"old\n", "lib/keep.py": b"print('keep')\n", "run.sh": b"#!/bin/sh\necho hi\n"},
            modes={"run.sh": 0o100755},
            message="seed",
            author=Identity(name="ana", email="ana@example.com"),
        )
        return created.token, store.path(("ana", "demo"))
    finally:
        await store.close()
        await db.dispose()


def serve(settings: Settings) -> Iterator[str]:
    import socket
    import threading

    import uvicorn

    from forge.app import create_app

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    served = msgspec.structs.replace(settings, host="127.0.0.1", port=port, base_url=f"http://127.0.0.1:{port}")
    server = uvicorn.Server(uvicorn.Config(create_app(served), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=90)


def task_settings(settings: Settings, **kw: Any) -> Settings:
    base: dict[str, Any] = {"run_worker": True, "model_api_key": SECRET, "task_wall_clock_seconds": 600}
    base.update(kw)
    return msgspec.structs.replace(settings, **base)


@pytest.fixture
def env(settings: Settings, sandbox_image: str) -> Iterator[Env]:
    s = task_settings(settings)
    token, path = asyncio.run(seed(s))
    for url in serve(s):
        yield Env(url=url, settings=s, token=token, repo_path=path)


async def start(c: httpx.AsyncClient, command: Any, **kw: Any) -> dict[str, Any]:
    r = await c.post("/api/v1/repos/ana/demo/tasks", json={"goal": "do it", "agent": "fixer", "command": command, **kw})
    assert r.status_code == 201, r.text
    body: dict[str, Any] = r.json()
    return body


async def wait_state(c: httpx.AsyncClient, number: int, *states: str, timeout: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        r = await c.get(f"/api/v1/repos/ana/demo/tasks/{number}")
        body: dict[str, Any] = r.json()
        if body["state"] in states:
            return body
        assert time.monotonic() < deadline, f"task stayed {body['state']}: {body}"
        await asyncio.sleep(0.2)


async def all_events(c: httpx.AsyncClient, number: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    after = 0
    while True:
        r = await c.get(f"/api/v1/repos/ana/demo/tasks/{number}/transcript", params={"after": after, "limit": 1000})
        page = r.json()
        out += page["events"]
        after = page["next_after"]
        if not page["events"]:
            return out


def output_text(events: list[dict[str, Any]], kind: str = "stdout") -> str:
    return "".join(e["payload"]["text"] for e in events if e["kind"] == kind)


def tree_files(repo_path: Path, sha: str) -> dict[str, tuple[int, bytes]]:
    repo = pygit2.Repository(str(repo_path))
    out: dict[str, tuple[int, bytes]] = {}

    def walk(tree: pygit2.Tree, prefix: str) -> None:
        for entry in tree:
            obj = repo[entry.id]
            if entry.filemode == pygit2.enums.FileMode.TREE:
                walk(obj, f"{prefix}{entry.name}/")
            else:
                out[f"{prefix}{entry.name}"] = (entry.filemode, obj.data)

    walk(repo[sha].peel(pygit2.Commit).tree, "")
    return out


def containers_of(settings: Settings) -> list[Any]:
    client = docker.from_env()
    try:
        return list(client.containers.list(all=True, filters={"label": f"forgehand.instance={settings.instance_id}"}))
    finally:
        client.close()


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


async def test_stop_kills_the_sandbox_then_retry_continues_from_the_wip_snapshot(env: Env) -> None:
    script = "if [ -f marker ]; then echo second; else touch marker; echo first; sleep 300; fi"
    async with env.client() as c:
        await start(c, script)
        deadline = time.monotonic() + 120
        while "first" not in output_text(await all_events(c, 1)):
            assert time.monotonic() < deadline
            await asyncio.sleep(0.2)
        assert containers_of(env.settings)
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
        deadline = time.monotonic() + 120
        while True:
            body = (await c.get("/api/v1/repos/ana/demo/tasks/1")).json()
            if len(body["runs"]) == 2 and body["state"] == "awaiting_review":
                break
            assert time.monotonic() < deadline, body
            await asyncio.sleep(0.2)
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


@pytest.fixture
def worker_env(settings: Settings, sandbox_image: str) -> Iterator[tuple[Settings, str]]:
    s = task_settings(settings, run_worker=False)
    token, _ = asyncio.run(seed(s))
    yield s, token


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
                deadline = time.monotonic() + 60
                while "started" not in output_text(await all_events(c, 1)):
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.2)
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
