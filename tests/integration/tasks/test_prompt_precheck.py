"""`user_prompt_submit` is asked before the request's write transaction: while a policy consumer
thinks, the rest of the forge can still write (on SQLite the write lock is database-wide, so a
slow consumer used to stall every writer, and a consumer that itself writes through the API would
stall until its own dispatch timed out)."""

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler
from typing import Any

import httpx
import msgspec
import pytest

from forge.core.settings import Settings
from forge.db.engine import Database
from tests.support.accounts import LiveServer, run_sync
from tests.support.http import LoopbackServer
from tests.support.task_world import TASKS, World, build_task_world

pytestmark = pytest.mark.db


@pytest.fixture
def settings(settings: Settings) -> Settings:
    return msgspec.structs.replace(settings, webhooks_allowed_hosts="127.0.0.1")


async def _make_world(settings: Settings) -> World:
    db = Database(settings.effective_database_url)
    try:
        return await build_task_world(db, settings)
    finally:
        await db.dispose()


class WritingConsumer:
    """On each prompt, first writes through the forge's API (a repository description), then allows."""

    def __init__(self, forge_url: str, token: str) -> None:
        self.inner: list[int] = []
        self.prompts: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", "0"))))
                if body["type"] == "user_prompt_submit":
                    outer.prompts.append(body["data"]["kind"])
                    r = httpx.patch(
                        f"{forge_url}/api/v1/repos/ana/demo",
                        json={"description": f"seen {len(outer.prompts)}"},
                        headers={"Authorization": f"Bearer {token}"},
                        timeout=30,
                    )
                    outer.inner.append(r.status_code)
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = LoopbackServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/policy"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def test_the_forge_can_write_while_a_prompt_policy_decides(live_server: LiveServer, settings: Settings) -> None:
    world = run_sync(_make_world(settings))
    consumer = WritingConsumer(live_server.url, world.tokens["ana"])
    h = world.h("ana")
    r = httpx.post(
        f"{live_server.url}/api/v1/repos/ana/demo/hooks",
        json={"url": consumer.url, "kind": "policy", "events": ["user_prompt_submit"]},
        headers=h,
        timeout=30,
    )
    assert r.status_code == 201, r.text
    r = httpx.post(
        f"{live_server.url}{TASKS}",
        json={"goal": "go", "agent": "fixer", "command": "true"},
        headers=h,
        timeout=60,
    )
    assert r.status_code == 201, r.text
    r = httpx.post(f"{live_server.url}{TASKS}/1/messages", json={"body": "and more"}, headers=h, timeout=60)
    assert r.status_code == 200, r.text
    assert consumer.prompts == ["goal", "message"]
    assert consumer.inner == [200, 200]  # the consumer's own writes went through during each dispatch
    repo = httpx.get(f"{live_server.url}/api/v1/repos/ana/demo", headers=h, timeout=30).json()
    assert repo["description"] == "seen 2"
    task = httpx.get(f"{live_server.url}{TASKS}/1", headers=h, timeout=30).json()
    assert task["queued_message"] == "and more"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_decision_on_no_approval_is_404_before_any_prompt_check(live_server: LiveServer, settings: Settings) -> None:
    """The denial reason of an approval that does not exist is nobody's prompt: a reachable consumer
    is not asked, and an unreachable fail-closed one does not turn the 404 into a 502."""
    world = run_sync(_make_world(settings))
    consumer = WritingConsumer(live_server.url, world.tokens["ana"])
    h = world.h("ana")
    r = httpx.post(
        f"{live_server.url}{TASKS}", json={"goal": "go", "agent": "fixer", "command": "true"}, headers=h, timeout=60
    )
    assert r.status_code == 201, r.text
    decide = f"{live_server.url}{TASKS}/1/approvals/no-such-approval"
    for url in (consumer.url, f"http://127.0.0.1:{_closed_port()}/policy"):
        r = httpx.post(
            f"{live_server.url}/api/v1/repos/ana/demo/hooks",
            json={"url": url, "kind": "policy", "events": ["user_prompt_submit"]},
            headers=h,
            timeout=30,
        )
        assert r.status_code == 201, r.text
        r = httpx.post(decide, json={"decision": "deny", "reason": "not this"}, headers=h, timeout=60)
        assert r.status_code == 404 and r.json()["code"] == "approval_not_found", r.text
    assert consumer.prompts == []
