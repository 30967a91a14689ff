"""A scripted policy consumer on 127.0.0.1: answers each lifecycle hook event with a fixed JSON
body (or status) and keeps what it was sent."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class PolicyConsumer:
    """Answers each policy event with a scripted JSON body (or status)."""

    def __init__(self, answers: dict[str, tuple[int, dict[str, Any] | None]]) -> None:
        self.answers = answers
        self.seen: list[dict[str, Any]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", "0"))))
                outer.seen.append(body)
                status, answer = outer.respond(body)
                data = json.dumps(answer).encode() if answer is not None else b""
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/policy"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def respond(self, body: dict[str, Any]) -> tuple[int, dict[str, Any] | None]:
        """The status and JSON answer to one event (no body: no opinion). Subclasses may script more."""
        return self.answers.get(body["type"], (200, None))

    def types(self) -> list[str]:
        return [b["type"] for b in self.seen]
