"""`forgehand hooks serve`: the reference consumer as a process, answering signed requests."""

import json
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from tests.support.ports import free_port
from tests.support.waiting import until_sync
from webhooks.cli import hooks_group
from webhooks.core.signing import SigningKey, request_headers, sign_jwt
from webhooks.sdk.protocol import encode_secret, kid_for

KEY = os.urandom(32)


def signed(url: str, tool: str, tool_input: dict[str, Any] | None = None) -> tuple[list[tuple[str, str]], bytes]:
    task = str(uuid.uuid4())
    wid = str(uuid.uuid4())
    body = json.dumps(
        {
            "type": "pre_tool_use",
            "meta": {
                "delivery_id": wid,
                "schema_version": 1,
                "instance": "fh-x",
                "repository": "ana/demo",
                "repository_uuid": "r",
                "task": {"id": task, "number": 1, "url": ""},
            },
            "data": {"tool_use_id": "c1", "tool_name": tool, "tool_input": tool_input or {}},
        },
        separators=(",", ":"),
    ).encode()
    now = int(time.time())
    token, _ = sign_jwt(
        SigningKey(kid_for(KEY), KEY),
        issuer="fh-x",
        subject=f"forgehand:task:{task}",
        audience=url,
        wid=wid,
        event_type="pre_tool_use",
        body=body,
        budget=5,
        now=now,
    )
    return request_headers(
        token=token, event_type="pre_tool_use", wid=wid, notification_keys=None, timestamp=now, body=body
    ), body


def test_serve_denies_matching_tools_and_logs_one_line_per_request() -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}/forgehand"
    code = "from webhooks.cli import hooks_group; hooks_group()"
    args = [
        "serve",
        "--audience",
        url,
        "--secret",
        encode_secret(KEY),
        "--issuer",
        "fh-x",
        "--deny-tool-pattern",
        "^bash$",
        "--port",
        str(port),
    ]
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    try:

        def listening() -> bool:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return True

        until_sync(listening, timeout=20, what="the consumer to listen", ignoring=(OSError,))
        with httpx.Client(timeout=5) as client:
            headers, body = signed(url, "bash")
            denied = client.post(url, headers=headers, content=body)
            headers, body = signed(url, "read_file")
            allowed = client.post(url, headers=headers, content=body)
            unsigned = client.post(url, content=body)
            spoofed_headers, spoofed_body = signed("http://evil.example/forgehand", "bash")
            spoofed = client.post(
                url, headers=[*spoofed_headers, ("X-Forwarded-Host", "evil.example")], content=spoofed_body
            )
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=10)
    assert "warning: --secret is visible to every user of this machine (ps)" in err
    assert denied.status_code == 200 and denied.json()["permission"]["decision"] == "deny"
    assert (allowed.status_code, allowed.content) == (200, b"")
    assert unsigned.status_code == 401 and spoofed.status_code == 401
    assert spoofed.json()["error"] == "wrong_audience"
    lines = [json.loads(line) for line in out.splitlines()]
    assert [x.get("decision") for x in lines if x.get("event") == "pre_tool_use"] == ["deny", None]
    assert [x["code"] for x in lines if x.get("event") == "rejected"] == ["missing_token", "wrong_audience"]


def test_serve_refuses_a_short_secret() -> None:
    result = CliRunner().invoke(
        hooks_group, ["serve", "--audience", "https://h.example/", "--secret", encode_secret(b"x" * 16)]
    )
    assert result.exit_code == 2 and "at least 32 bytes" in result.output


@contextmanager
def consumer(*args: str, env: dict[str, str]) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """`forgehand hooks serve` (the installed command) on a free port, up; its URL and process."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/forgehand"
    forgehand = str(Path(sys.executable).with_name("forgehand"))
    argv = [forgehand, "hooks", "serve", "--audience", url, "--issuer", "fh-x", "--port", str(port), *args]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read() if proc.stderr else ""
                time.sleep(0.05)
        yield url, proc
    finally:
        if proc.poll() is None:
            proc.terminate()
        proc.wait(timeout=10)


def _decision(client: httpx.Client, url: str, tool: str, tool_input: dict[str, Any]) -> str | None:
    headers, body = signed(url, tool, tool_input)
    r = client.post(url, headers=headers, content=body)
    assert r.status_code == 200, r.text
    return r.json()["permission"]["decision"] if r.content else None


def test_serve_takes_the_secret_from_a_file_and_answers_ask_for_matching_calls(tmp_path: Path) -> None:
    secret = encode_secret(KEY)
    secret_file = tmp_path / "hook-secret"
    secret_file.write_text(f"# the policy endpoint of ana/demo\n{secret}\n")
    secret_file.chmod(0o600)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FORGEHAND_")}
    args = ["--secret-file", str(secret_file), "--ask-tool-pattern", "^Bash: git push", "--deny-tool-pattern", "^rm$"]
    with consumer(*args, env=env) as (url, proc), httpx.Client(timeout=5) as client:
        assert secret not in Path(f"/proc/{proc.pid}/cmdline").read_text()  # nothing for `ps` to show
        headers, body = signed(url, "Bash", {"command": "git push origin main"})
        asked = client.post(url, headers=headers, content=body)
        assert asked.status_code == 200
        permission = asked.json()["permission"]
        assert permission["decision"] == "ask"
        assert permission["reason"] == (
            "'Bash: git push origin main' matches the ask pattern '^Bash: git push': a person decides"
        )
        assert _decision(client, url, "Bash", {"command": "git status"}) is None
        assert _decision(client, url, "exec_command", {"command": ["git", "push"]}) is None  # another tool
        assert _decision(client, url, "rm", {"command": "git push"}) == "deny"  # a deny wins over an ask
    out, err = proc.communicate(timeout=10)
    assert "warning" not in err
    logged = [json.loads(line) for line in out.splitlines() if '"pre_tool_use"' in line]
    assert [x["decision"] for x in logged] == ["ask", None, None, "deny"]


def test_serve_takes_the_secret_from_the_environment_and_asks_by_tool_name() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FORGEHAND_")}
    other = encode_secret(os.urandom(32))
    env["FORGEHAND_HOOKS_SECRET"] = f"{other} {encode_secret(KEY)}"  # two during a rotation
    with consumer("--ask-tool-pattern", "^(Bash|Write)$", env=env) as (url, proc), httpx.Client(timeout=5) as client:
        assert encode_secret(KEY) not in Path(f"/proc/{proc.pid}/cmdline").read_text()
        assert _decision(client, url, "Bash", {"command": "ls"}) == "ask"
        assert _decision(client, url, "Write", {"file_path": "a.txt"}) == "ask"
        assert _decision(client, url, "Read", {"file_path": "a.txt"}) is None


def test_serve_without_a_secret_says_how_to_give_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FORGEHAND_HOOKS_SECRET", raising=False)
    r = CliRunner().invoke(hooks_group, ["serve", "--audience", "https://h.example/"])
    assert r.exit_code == 2 and "--secret-file PATH" in r.output and "FORGEHAND_HOOKS_SECRET" in r.output
    empty = tmp_path / "empty"
    empty.write_text("\n# nothing here\n")
    r = CliRunner().invoke(hooks_group, ["serve", "--audience", "https://h.example/", "--secret-file", str(empty)])
    assert r.exit_code == 2 and "holds no secret" in r.output
    r = CliRunner().invoke(hooks_group, ["serve", "--audience", "https://h.example/", "--secret-file", str(tmp_path)])
    assert r.exit_code == 2 and "--secret-file" in r.output
    monkeypatch.setenv("FORGEHAND_HOOKS_SECRET", encode_secret(b"x" * 16))
    r = CliRunner().invoke(hooks_group, ["serve", "--audience", "https://h.example/"])
    assert r.exit_code == 2 and "at least 32 bytes" in r.output and "FORGEHAND_HOOKS_SECRET" in r.output
