"""A stand-in for a run's gateway socket: an HTTP/1.1 server on a Unix socket in a channel directory.

The sandbox side (the agents image's hook bridge, relay and CLI) is tested against it before and
without the real gateway (tasks/run/gateway/): it checks the run token like the gateway does,
records every hook call and answers it as the test says, and plays a minimal model on
`POST /v1/messages` (streamed SSE as the Anthropic API frames it; text and tool_use turns).

    with FakeChannel(tmp_path / "ch", token="fhr_x", turns=[tool_use("Bash", {...}), text("ok")]) as ch:
        spec = SandboxSpec(..., channel_dir=ch.dir)
        ch.hooks   # [HookCall(agent, event, body, authorization)]
"""

import json
import os
import secrets
import socketserver
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import msgspec


class HookCall(msgspec.Struct, kw_only=True):
    agent: str
    event: str
    body: dict[str, Any]
    authorization: str


class Reply(msgspec.Struct, kw_only=True):
    """What the fake gateway answers to a hook call."""

    status: int = 200
    body: bytes = b"{}"
    delay: float = 0.0  # seconds before answering
    close: bool = False  # drop the connection without an answer
    raw: bytes | None = None  # bytes written instead of an HTTP answer


def reply_json(payload: Any, status: int = 200) -> Reply:
    return Reply(status=status, body=json.dumps(payload).encode())


def allow(reason: str = "ok") -> Reply:
    return reply_json(
        {
            "hookSpecificOutput": {
                "hookEventName": "PreToolUse",
                "permissionDecision": "allow",
                "permissionDecisionReason": reason,
            }
        }
    )


def deny(reason: str) -> Reply:
    return reply_json(
        {
            "hookSpecificOutput": {
                "hookEventName": "PreToolUse",
                "permissionDecision": "deny",
                "permissionDecisionReason": reason,
            }
        }
    )


def text(content: str) -> dict[str, Any]:
    return {"type": "text", "text": content}


def tool_use(name: str, input: dict[str, Any]) -> dict[str, Any]:
    return {"type": "tool_use", "id": f"toolu_{secrets.token_hex(8)}", "name": name, "input": input}


def _sse(block: dict[str, Any], model: str) -> list[tuple[str, dict[str, Any]]]:
    usage = {"input_tokens": 10, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0, "output_tokens": 1}
    message: dict[str, Any] = {
        "id": f"msg_{secrets.token_hex(8)}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": usage,
    }
    if block["type"] == "text":
        start: dict[str, Any] = {"type": "text", "text": ""}
        delta: dict[str, Any] = {"type": "text_delta", "text": block["text"]}
        stop = "end_turn"
    else:
        start = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
        delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        stop = "tool_use"
    return [
        ("message_start", {"type": "message_start", "message": message}),
        ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": start}),
        ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop, "stop_sequence": None},
                "usage": {"output_tokens": 5},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]


def default_reply(call: HookCall) -> Reply:
    """PreToolUse: allow; any other event: an empty object (nothing to say)."""
    return allow() if call.event == "PreToolUse" else reply_json({})


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    request_queue_size = 64


class FakeChannel:
    def __init__(
        self,
        directory: Path,
        *,
        token: str = "",
        turns: list[dict[str, Any]] | None = None,
        hook: Callable[[HookCall], Reply] | None = None,
        socket_name: str = "gateway.sock",
        stream: Callable[[str, dict[str, Any]], list[bytes] | None] | None = None,
    ) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir, 0o755)  # noqa: S103 (the sandbox user must reach the socket)
        self.socket_path = self.dir / socket_name
        self.token = token or f"fhr_{secrets.token_urlsafe(32)}"
        self.turns = list(turns or [])
        self.hook = hook or default_reply
        # Another model API: (path, body) -> the SSE frames of the answer, or None (no such route).
        self.stream = stream
        self.hooks: list[HookCall] = []
        self.messages: list[dict[str, Any]] = []  # the /v1/messages request bodies
        self.refused = 0  # requests without the run's token
        self._lock = threading.Lock()
        channel = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def address_string(self) -> str:
                return "unix"

            def log_message(self, *args: Any) -> None:
                pass

            def do_HEAD(self) -> None:
                self._send(200, b"", "text/plain")

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length", "0") or 0))
                auth = self.headers.get("Authorization", "")
                key = self.headers.get("x-api-key", "")
                if f"Bearer {channel.token}" != auth and key != channel.token:
                    with channel._lock:
                        channel.refused += 1
                    body = {"type": "error", "error": {"type": "authentication_error", "message": "bad run token"}}
                    self._send(401, json.dumps(body).encode(), "application/json")
                    return
                try:
                    payload = json.loads(raw or b"{}")
                except ValueError:
                    payload = {"_raw": raw.decode(errors="replace")}
                path = self.path.split("?", 1)[0]
                parts = path.strip("/").split("/")
                if len(parts) == 3 and parts[0] == "hooks":
                    self._hook(HookCall(agent=parts[1], event=parts[2], body=payload, authorization=auth))
                elif path == "/v1/messages":
                    self._model(payload)
                elif channel.stream is not None and (frames := channel.stream(path, payload)) is not None:
                    self._frames(frames)
                else:
                    self._send(404, b'{"error": "no route"}', "application/json")

            def _hook(self, call: HookCall) -> None:
                with channel._lock:
                    channel.hooks.append(call)
                reply = channel.hook(call)
                if reply.delay:
                    time.sleep(reply.delay)  # a slow hook server is the scenario, not a wait
                if reply.close or reply.raw is not None:
                    self.wfile.write(reply.raw or b"")
                    self.close_connection = True
                    return
                self._send(reply.status, reply.body, "application/json")

            def _model(self, payload: dict[str, Any]) -> None:
                with channel._lock:
                    channel.messages.append(payload)
                    block = channel.turns.pop(0) if channel.turns else text("(script exhausted)")
                model = str(payload.get("model", "claude"))
                self._frames([f"event: {e}\ndata: {json.dumps(d)}\n\n".encode() for e, d in _sse(block, model)])

            def _frames(self, frames: list[bytes]) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for frame in frames:
                    self.wfile.write(f"{len(frame):x}\r\n".encode() + frame + b"\r\n")
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()

            def _send(self, code: int, data: bytes, content_type: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = _Server(str(self.socket_path), Handler)
        # The sandbox user connects; the token is the lock (as for the real gateway socket).
        os.chmod(self.socket_path, 0o666)  # noqa: S103
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> "FakeChannel":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)
        self.socket_path.unlink(missing_ok=True)
