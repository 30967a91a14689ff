"""`forgehand hooks serve`: the reference consumer as a process, answering signed requests."""

import json
import os
import socket
import subprocess
import sys
import time
import uuid

import httpx
from click.testing import CliRunner

from tests.support.waiting import until_sync
from tests.support.webhooks import free_port
from webhooks.cli import hooks_group
from webhooks.protocol import encode_secret, kid_for
from webhooks.signing import SigningKey, request_headers, sign_jwt

KEY = os.urandom(32)


def signed(url: str, tool: str) -> tuple[list[tuple[str, str]], bytes]:
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
            "data": {"tool_use_id": "c1", "tool_name": tool, "tool_input": {}},
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
        out, _ = proc.communicate(timeout=10)
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
