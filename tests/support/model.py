"""A scripted OpenAI-compatible chat completions server for tests: a real HTTP server on 127.0.0.1.

Each test scripts the model's turns; the server answers them in order and records every request
(so a test can check what the agent sent: the conversation, the tools, the key).

    with ScriptedModel([tool_call("write_file", {"path": "a", "content": "b"}), reply("done")]) as model:
        settings = replace(settings, model_base_url=model.url, model_name="scripted")
"""

import json
import threading
from http.server import BaseHTTPRequestHandler
from typing import Any

import msgspec

from tests.support.http import LoopbackServer


class Turn(msgspec.Struct, kw_only=True):
    status: int = 200
    headers: dict[str, str] = msgspec.field(default_factory=dict)
    message: dict[str, Any] | None = None
    usage: dict[str, int] = msgspec.field(default_factory=lambda: {"prompt_tokens": 10, "completion_tokens": 5})
    raw: bytes | None = None


_counter = iter(range(1, 1_000_000))


def tool_call(name: str, args: Any, *, call_id: str | None = None, content: str = "") -> Turn:
    """The model calls one tool (`args` a dict, or a raw string for malformed JSON)."""
    return tool_calls([(name, args, call_id)], content=content)


def tool_calls(calls: list[tuple[str, Any, str | None]], *, content: str = "") -> Turn:
    out = []
    for name, args, call_id in calls:
        arguments = args if isinstance(args, str) else json.dumps(args)
        out.append(
            {
                "id": call_id or f"call_{next(_counter)}",
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            }
        )
    return Turn(message={"role": "assistant", "content": content, "tool_calls": out})


def reply(text: str) -> Turn:
    return Turn(message={"role": "assistant", "content": text})


def error(status: int, *, retry_after: str | None = None) -> Turn:
    return Turn(status=status, headers={"Retry-After": retry_after} if retry_after else {}, raw=b'{"error":"busy"}')


class ScriptedModel:
    def __init__(self, turns: list[Turn], *, repeat_last: bool = False) -> None:
        self.turns = list(turns)
        self.repeat_last = repeat_last
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self._lock = threading.Lock()
        model = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length) or b"{}")
                with model._lock:
                    model.requests.append(body)
                    model.headers.append({k.lower(): v for k, v in self.headers.items()})
                    if self.path.rstrip("/") != "/v1/chat/completions":
                        turn = Turn(status=404, raw=b"{}")
                    elif model.turns:
                        turn = model.turns.pop(0) if (len(model.turns) > 1 or not model.repeat_last) else model.turns[0]
                    else:
                        turn = Turn(status=500, raw=b'{"error":"script exhausted"}')
                data = turn.raw
                if data is None:
                    data = json.dumps(
                        {
                            "id": "chatcmpl-test",
                            "object": "chat.completion",
                            "model": body.get("model", ""),
                            "choices": [{"index": 0, "message": turn.message, "finish_reason": "stop"}],
                            "usage": turn.usage,
                        }
                    ).encode()
                self.send_response(turn.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for key, value in turn.headers.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(data)

        self.server = LoopbackServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "ScriptedModel":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=10)
