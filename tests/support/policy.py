"""A policy consumer on 127.0.0.1 that answers each policy event with a scripted body (or
status), and a served task world whose repository sends those events to it."""

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import httpx

from forge.accounts import accounts, tokens
from forge.core.settings import Settings
from forge.db.audit import Actor
from forge.db.engine import Database
from tests.support.http import LoopbackServer
from tests.support.ports import free_port
from tests.support.tasks import Env, seed, serve
from tests.support.waiting import until_sync


class PolicyConsumer:
    """Answers each policy event with a scripted JSON body (or status): `answers` by event type,
    or a subclass's `answer` (which may act before it answers)."""

    def __init__(self, answers: dict[str, tuple[int, dict[str, Any] | None]] | None = None) -> None:
        self.answers = answers or {}
        self.seen: list[dict[str, Any]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", "0"))))
                outer.seen.append(body)
                status, answer = outer.answer(body)
                data = json.dumps(answer).encode() if answer is not None else b""
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = LoopbackServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/policy"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def answer(self, body: dict[str, Any]) -> tuple[int, dict[str, Any] | None]:
        return self.answers.get(body["type"], (200, None))

    def types(self) -> list[str]:
        return [b["type"] for b in self.seen]


def denying(needle: str, reason: str) -> PolicyConsumer:
    """A consumer that denies every `pre_tool_use` whose input mentions `needle` (and answers
    nothing else)."""

    class Denying(PolicyConsumer):
        def answer(self, body: dict[str, Any]) -> tuple[int, dict[str, Any] | None]:
            if body["type"] == "pre_tool_use" and needle in json.dumps(body["data"]["tool_input"]):
                return 200, {"permission": {"decision": "deny", "reason": reason}}
            return 200, None

    return Denying()


async def make_hook_token(settings: Settings) -> str:
    db = Database(settings.effective_database_url)
    try:
        async with db.session(write=True) as s:
            ana = await accounts.require_by_login(s, "ana")
            return (await tokens.create(s, Actor.system("test"), ana, "hooks", ["webhooks:admin"], None)).token
    finally:
        await db.dispose()


def served_with_policy(
    settings: Settings, consumer: PolicyConsumer, events: list[str], failure: str = "closed"
) -> Iterator[Env]:
    token, path = asyncio.run(seed(settings))
    admin_token = asyncio.run(make_hook_token(settings))
    for url in serve(settings):
        r = httpx.post(
            f"{url}/api/v1/repos/ana/demo/hooks",
            json={"url": consumer.url, "kind": "policy", "events": events, "failure_policy": failure},
            headers={"Authorization": f"Bearer {admin_token}"},
            timeout=30,
        )
        assert r.status_code == 201, r.text
        yield Env(url=url, settings=settings, token=token, repo_path=path)


@contextmanager
def reference_consumer(
    forge_url: str, admin_token: str, deny_tool_pattern: str | None = None, *, ask_tool_pattern: str | None = None
) -> Iterator[subprocess.Popen[str]]:
    """The shipped reference consumer, `forgehand hooks serve --deny-tool-pattern PATTERN` (or
    `--ask-tool-pattern`), as its own process with the endpoint secret in FORGEHAND_HOOKS_SECRET,
    registered as the demo repository's `pre_tool_use` policy endpoint; its decision log (one JSON
    line per event) is on the process's stdout once it has ended."""
    port = free_port()
    hook_url = f"http://127.0.0.1:{port}/forgehand"
    r = httpx.post(
        f"{forge_url}/api/v1/repos/ana/demo/hooks",
        json={"url": hook_url, "kind": "policy", "events": ["pre_tool_use"]},
        headers={"Authorization": f"Bearer {admin_token}"},
        timeout=30,
    )
    assert r.status_code == 201, r.text
    args = ["hooks", "serve", "--audience", hook_url, "--port", str(port)]
    args += ["--deny-tool-pattern", deny_tool_pattern] if deny_tool_pattern else []
    args += ["--ask-tool-pattern", ask_tool_pattern] if ask_tool_pattern else []
    cli = str(Path(sys.executable).parent / "forgehand")
    env = {**os.environ, "FORGEHAND_HOOKS_SECRET": r.json()["secret"]}
    proc = subprocess.Popen([cli, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:

        def listening() -> bool:
            assert proc.poll() is None, "hooks serve exited before it listened"
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return True

        until_sync(listening, timeout=20, what="hooks serve to listen", ignoring=(OSError,))
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
        proc.wait(timeout=10)


def decisions(proc: subprocess.Popen[str]) -> list[dict[str, Any]]:
    """The reference consumer's decision log, read after it ended."""
    assert proc.stdout is not None
    return [json.loads(line) for line in proc.stdout.read().splitlines() if line.strip()]
