"""No ref moves without a record: a push is journaled before git runs and recorded whether or not
the client stays (real git CLI, real server on 127.0.0.1), and a server killed between the ref
update and the record is reconciled on its next start, exactly once."""

import asyncio
import base64
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select

from forge.core.settings import Settings, load_settings, prepare_data_dir
from forge.db.audit import Actor
from forge.db.engine import Database
from forge.db.events import EventBus
from forge.db.models import AuditEvent, PushRecord, Repository
from forge.git.journal import PushJournal
from forge.git.pktline import FLUSH_PKT, pkt_line
from forge.repos.pushes import PushRecorder
from tests.support.accounts import LiveServer, make_account_with_token, run_sync
from tests.support.git import git, pack_objects
from tests.support.ports import free_port
from tests.support.waiting import until_sync
from webhooks.core.config import WebhooksConfig
from webhooks.core.models import WebhookOutbox
from webhooks.core.schemas import HookCreate
from webhooks.service import create_endpoint

FORGEHAND = str(Path(sys.executable).with_name("forgehand"))


async def _counts(url: str, journal_id: str | None = None) -> dict[str, int]:
    db = Database(url)
    try:
        async with db.session() as s:
            pushes = select(func.count()).select_from(PushRecord)
            if journal_id is not None:
                pushes = pushes.where(PushRecord.journal_id == journal_id)
            audits = select(func.count()).select_from(AuditEvent).where(AuditEvent.action == "repo.push")
            outbox = select(func.count()).select_from(WebhookOutbox).where(WebhookOutbox.event_type == "repo.pushed")
            return {
                "pushes": int((await s.execute(pushes)).scalar_one()),
                "audit": int((await s.execute(audits)).scalar_one()),
                "outbox": int((await s.execute(outbox)).scalar_one()),
            }
    finally:
        await db.dispose()


async def _subscribe(settings: Settings, owner: str, name: str) -> None:
    """A notification endpoint for `repo.pushed`, so that the event leaves an outbox row."""
    db = Database(settings.effective_database_url)
    try:
        async with db.session(write=True) as s:
            repo = (await s.execute(select(Repository).where(Repository.name == name))).scalar_one()
            data = HookCreate(url="https://93.184.216.34/hook", kind="notify", events=["repo.pushed"])
            await create_endpoint(s, Actor.system("test"), WebhooksConfig.from_settings(settings), repo, data)
    finally:
        await db.dispose()


def _wait(check: Any, what: str, timeout: float = 30) -> None:
    until_sync(check, timeout=timeout, what=what)


def _bare_main(settings: Settings) -> str:
    bare = settings.data_dir / "repos" / "ana" / "demo.git"
    head = subprocess.run(["git", f"--git-dir={bare}", "rev-parse", "main"], capture_output=True, text=True)
    return head.stdout.strip()


def _setup_repo(url: str, settings: Settings, tmp: Path) -> tuple[str, Path]:
    token = run_sync(make_account_with_token(settings, "ana", "repo:write"))
    r = httpx.post(
        f"{url}/api/v1/user/repos",
        headers={"Authorization": f"Bearer {token}"},
        json={"name": "demo", "auto_init": True},
        timeout=30,
    )
    assert r.status_code == 201, r.text
    run_sync(_subscribe(settings, "ana", "demo"))
    work = tmp / "work"
    git("clone", f"http://x:{token}@{url.removeprefix('http://')}/ana/demo.git", str(work), cwd=tmp)
    (work / "a.txt").write_text("one\n")
    git("add", ".", cwd=work)
    git("commit", "-qm", "a", cwd=work)
    return token, work


def _rev(work: Path, rev: str) -> str:
    return git("rev-parse", rev, cwd=work).stdout.strip()


def _receive_pack_request(url: str, token: str, work: Path) -> bytes:
    old, new = _rev(work, "origin/main"), _rev(work, "HEAD")
    pack = pack_objects(work, new, old)
    body = pkt_line(f"{old} {new} refs/heads/main\0report-status agent=test\n") + FLUSH_PKT + pack
    auth = base64.b64encode(f"x:{token}".encode()).decode()
    head = [
        "POST /ana/demo.git/git-receive-pack HTTP/1.1",
        f"Host: {url.removeprefix('http://')}",
        "Content-Type: application/x-git-receive-pack-request",
        f"Content-Length: {len(body)}",
        f"Authorization: Basic {auth}",
    ]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


@pytest.mark.parametrize("hang_up", ["after unpack ok", "without reading the answer"])
def test_a_client_that_hangs_up_still_leaves_a_record(live_server: LiveServer, tmp_path: Path, hang_up: str) -> None:
    url, settings = live_server.url, live_server.settings
    token, work = _setup_repo(url, settings, tmp_path)
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(_receive_pack_request(url, token, work))
        if hang_up == "after unpack ok":
            seen = b""
            while b"unpack ok" not in seen:
                chunk = sock.recv(65536)
                assert chunk, seen
                seen += chunk
        else:  # the whole request is in once its journal entry is written and git moved the ref
            journal = settings.data_dir / "push-journal"
            _wait(
                lambda: list(journal.glob("*.json")) or run_sync(_counts(settings.effective_database_url))["pushes"],
                "no push",
            )
            _wait(lambda: _bare_main(settings) == _rev(work, "HEAD"), "git to move main (the whole pack is in)")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST
    db_url = settings.effective_database_url
    _wait(lambda: run_sync(_counts(db_url))["pushes"] == 1, "the push was not recorded")
    assert run_sync(_counts(db_url)) == {"pushes": 1, "audit": 1, "outbox": 1}
    assert _bare_main(settings) == _rev(work, "HEAD")
    _wait(lambda: not list((settings.data_dir / "push-journal").iterdir()), "the journal entry was not crossed out")


class Serve:
    def __init__(self, data: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("FORGEHAND_")}
        self.env.update(
            {
                "FORGEHAND_DATA_DIR": str(data),
                "FORGEHAND_PORT": str(self.port),
                "FORGEHAND_SEED_DEMO": "false",
                "FORGEHAND_RUN_WORKER": "false",
                "FORGEHAND_BASE_URL": self.url,
            }
        )
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen([FORGEHAND, "serve"], env=self.env, stdout=subprocess.DEVNULL)
        proc = self.proc

        def healthy() -> bool:
            assert proc.poll() is None, "forgehand serve exited"
            return httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200

        until_sync(healthy, timeout=60, what="forgehand serve to come up", ignoring=(httpx.TransportError,))

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            self.proc.wait(30)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Serve, Settings]]:
    data = tmp_path / "var"
    server = Serve(data)
    server.start()
    url = f"sqlite+aiosqlite:///{data / 'forgehand.db'}"
    settings = prepare_data_dir(load_settings(environ={}, data_dir=data, database_url=url))
    try:
        yield server, settings
    finally:
        server.stop()


def test_a_server_killed_before_the_record_is_reconciled_on_start(
    served: tuple[Serve, Settings], tmp_path: Path
) -> None:
    server, settings = served
    token, work = _setup_repo(server.url, settings, tmp_path)
    # Credentials up front: git's usual anonymous first try would be audited (a write) as refused.
    auth = "http.extraHeader=Authorization: Basic " + base64.b64encode(f"x:{token}".encode()).decode()
    journal = settings.data_dir / "push-journal"
    repos = settings.data_dir / "repos"
    git("-c", auth, "fetch", "origin", cwd=work)  # the token is in the server's cache now: a push needs no write
    # Hold SQLite's write lock: git moves the ref, the record waits for the lock; then SIGKILL.
    lock = sqlite3.connect(settings.data_dir / "forgehand.db", isolation_level=None)
    lock.execute("BEGIN IMMEDIATE")
    try:
        git("-c", auth, "push", "origin", "main", cwd=work)
        entries = list(journal.glob("*.json"))
        assert len(entries) == 1
        saved = entries[0].read_bytes()
        server.kill()
    finally:
        lock.execute("ROLLBACK")
        lock.close()
    db_url = settings.effective_database_url
    assert run_sync(_counts(db_url)) == {"pushes": 0, "audit": 0, "outbox": 0}  # the ref moved, nothing recorded
    old, fresh = (
        repos / "ana" / "demo.git" / "objects" / "incoming-old",
        repos / "ana" / "demo.git" / "objects" / "tmp_objdir-incoming-fresh",
    )
    for debris in (old, fresh):
        (debris / "pack").mkdir(parents=True)
        (debris / "pack" / "tmp_pack_x").write_bytes(b"\0" * 1024)
    two_hours_ago = time.time() - 7200
    for path in (old / "pack" / "tmp_pack_x", old / "pack", old):
        os.utime(path, (two_hours_ago, two_hours_ago))
    server.start()
    entry_id = entries[0].stem
    assert run_sync(_counts(db_url, entry_id)) == {"pushes": 1, "audit": 1, "outbox": 1}
    assert not list(journal.iterdir())
    assert not old.exists() and fresh.exists()
    # A crash after the record but before the entry was crossed out: settled again, recorded once.
    entries[0].write_bytes(saved)
    recorder = PushRecorder(Database(db_url), EventBus(), PushJournal(journal), repos)
    assert asyncio.run(_reconcile(recorder)) == 1
    assert run_sync(_counts(db_url)) == {"pushes": 1, "audit": 1, "outbox": 1}
    assert not list(journal.iterdir())


async def _reconcile(recorder: PushRecorder) -> int:
    try:
        return await recorder.reconcile()
    finally:
        await recorder.db.dispose()


def test_a_ref_lock_left_by_a_killed_writer_is_swept_and_the_branch_takes_pushes_again(tmp_path: Path) -> None:
    """A process killed while it held `refs/heads/main.lock` (a push's receive-pack, a merge) leaves
    it: git refuses every push to main. The reconciliation (at start and periodically) removes it
    once it is older than any live update holds one; a fresh lock is left alone."""
    repos = tmp_path / "repos"
    bare = repos / "ana" / "demo.git"
    git("init", "-q", "--bare", "-b", "main", str(bare), cwd=tmp_path)
    work = tmp_path / "work"
    git("clone", "-q", str(bare), str(work), cwd=tmp_path)
    (work / "a.txt").write_text("a\n")
    git("add", ".", cwd=work)
    git("commit", "-q", "-m", "a", cwd=work)
    git("push", "-q", "origin", "main", cwd=work)
    stale, fresh = bare / "refs" / "heads" / "main.lock", bare / "refs" / "heads" / "other.lock"
    stale.write_text("")
    fresh.write_text("")
    old = time.time() - 60
    os.utime(stale, (old, old))
    (work / "b.txt").write_text("b\n")
    git("add", ".", cwd=work)
    git("commit", "-q", "-m", "b", cwd=work)
    refused = git("push", "-q", "origin", "main", cwd=work, check=False)
    assert refused.returncode != 0 and "lock" in refused.stderr  # what the leftover did
    recorder = PushRecorder(
        Database(f"sqlite+aiosqlite:///{tmp_path / 'f.db'}"), EventBus(), PushJournal(tmp_path / "journal"), repos
    )
    asyncio.run(_reconcile(recorder))
    assert not stale.exists() and fresh.exists()
    git("push", "-q", "origin", "main", cwd=work)
    assert git("rev-parse", "main", cwd=bare).stdout.strip() == git("rev-parse", "HEAD", cwd=work).stdout.strip()
