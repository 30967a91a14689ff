"""The composition: events of a real push and a real task reach a real consumer as signed
notifications (outbox -> deliverer -> HTTP), verified with the consumer SDK."""

import json
import os
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from forge.core.settings import Settings
from tests.support.accounts import LiveServer, make_account_with_token, run_sync
from tests.support.http import LoopbackServer
from tests.support.waiting import until_sync
from webhooks.sdk import Verifier


@pytest.fixture
def settings(settings: Settings, sandbox_image: str) -> Settings:
    # This module's server runs the worker and the deliverer, and may call a consumer on loopback.
    return msgspec.structs.replace(settings, run_worker=True, webhooks_allowed_hosts="127.0.0.1")


class Consumer:
    def __init__(self) -> None:
        self.received: list[tuple[dict[str, str], bytes]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                outer.received.append(({k.lower(): v for k, v in self.headers.items()}, body))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = LoopbackServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def types(self) -> list[str]:
        return [json.loads(body)["type"] for _, body in self.received]

    def wait_for(self, event: str, timeout: float = 60) -> None:
        until_sync(lambda: event in self.types(), timeout=timeout, what=f"{event} to arrive", show=self.types)


@pytest.fixture
def consumer() -> Iterator[Consumer]:
    c = Consumer()
    yield c
    c.server.shutdown()


def test_push_and_task_events_are_delivered_signed(live_server: LiveServer, consumer: Consumer, tmp_path: Path) -> None:
    token = run_sync(
        make_account_with_token(live_server.settings, "ana", "repo:write", "tasks:write", "webhooks:admin")
    )
    api = httpx.Client(base_url=live_server.url, headers={"Authorization": f"Bearer {token}"}, timeout=30)
    assert api.post("/api/v1/user/repos", json={"name": "app", "auto_init": True}).status_code == 201
    bot_token = run_sync(make_account_with_token(live_server.settings, "fixer-admin", "admin", admin=True))
    assert (
        httpx.post(
            f"{live_server.url}/api/v1/admin/bots",
            json={"login": "fixer"},
            headers={"Authorization": f"Bearer {bot_token}"},
        ).status_code
        == 201
    )
    assert api.put("/api/v1/repos/ana/app/collaborators/fixer", json={"role": "write"}).status_code == 200
    created = api.post(
        "/api/v1/repos/ana/app/hooks",
        json={
            "url": consumer.url,
            "kind": "notify",
            "events": ["repo.pushed", "task.created", "task.state_changed", "run.started", "run.finished"],
        },
    )
    assert created.status_code == 201, created.text
    secret = created.json()["secret"]

    # a real push
    work = tmp_path / "w"
    host = live_server.url.removeprefix("http://")
    env = {**os.environ, "HOME": str(tmp_path), "GIT_AUTHOR_NAME": "A", "GIT_AUTHOR_EMAIL": "a@x",
           "GIT_COMMITTER_NAME": "A", "GIT_COMMITTER_EMAIL": "a@x", "GIT_TERMINAL_PROMPT": "0"}  # fmt: skip
    subprocess.run(["git", "clone", "-q", f"http://ana:{token}@{host}/ana/app.git", str(work)], env=env, check=True)
    (work / "x.txt").write_text("x\n")
    subprocess.run(["git", "-C", str(work), "add", "."], env=env, check=True)
    subprocess.run(["git", "-C", str(work), "commit", "-qm", "x"], env=env, check=True)
    subprocess.run(["git", "-C", str(work), "push", "-q", "origin", "main"], env=env, check=True)
    consumer.wait_for("repo.pushed")

    # a real task
    r = api.post("/api/v1/repos/ana/app/tasks", json={"goal": "touch a file", "agent": "fixer", "runtime": "command",
                                                      "command": "echo hi > hi.txt"})  # fmt: skip
    assert r.status_code == 201, r.text
    consumer.wait_for("run.finished")
    until_sync(
        lambda: any(
            json.loads(b)["type"] == "task.state_changed" and json.loads(b)["data"].get("to") == "awaiting_review"
            for _, b in consumer.received
        ),
        timeout=30,
        what="task.state_changed to awaiting_review",
        show=consumer.types,
    )

    verifier = Verifier(audience=consumer.url, secrets=[secret], issuer=live_server.settings.instance_id)
    for headers, body in consumer.received:
        claims = verifier.verify_headers("POST", headers)
        request = verifier.verify_body(claims, body)
        assert request is not None
        assert headers["webhook-id"] and headers["webhook-signature"].startswith("v1,")
    types = consumer.types()
    assert types.index("task.created") < types.index("run.started") < types.index("run.finished")
    pushed = next(json.loads(b) for _, b in consumer.received if json.loads(b)["type"] == "repo.pushed")
    assert pushed["meta"]["repository"] == "ana/app"
    assert pushed["data"]["refs"][0]["ref"] == "refs/heads/main"
