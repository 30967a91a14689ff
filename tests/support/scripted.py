"""What the scripted provider servers (tests/support/anthropic.py, openai_responses.py) share: a
real HTTP/1.1 server on 127.0.0.1 answering with scripted turns in order, recording every request
(method, path, query, headers, body), and writing streamed answers as chunked server-sent events."""

import json
import secrets
import threading
import time
from collections.abc import Callable, Iterable
from http.server import BaseHTTPRequestHandler
from typing import Any, Generic, Protocol, Self, TypeVar
from urllib.parse import parse_qsl, urlsplit

import msgspec

from tests.support.http import LoopbackServer

TurnT = TypeVar("TurnT")


class ScriptedTurn(Protocol):
    """What every scripted turn says besides its content."""

    status: int
    headers: dict[str, str]
    delay: float  # seconds before the status line
    event_delay: float  # seconds between two events of a stream
    hang: bool
    raw: bytes | None  # a body sent as-is (error answers)


class Recorded(msgspec.Struct, kw_only=True):
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]  # lower-cased names
    body: dict[str, Any]
    raw: bytes = b""  # the body's bytes as they arrived (what a parser other than json.loads reads)


def pieces(value: str, count: int) -> list[str]:
    """`value` in about `count` pieces (the deltas of a streamed text)."""
    if not value:
        return []
    size = max(1, -(-len(value) // max(1, count)))
    return [value[i : i + size] for i in range(0, len(value), size)]


class ScriptedHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive and chunked streams, as the real APIs
    disable_nagle_algorithm = True  # each SSE event leaves at once (no 40 ms delayed-ACK stalls)
    server_api: "ScriptedServer[Any]"  # set per server (ScriptedServer.__init__)
    request_id_header = "request-id"

    def log_message(self, *args: Any) -> None:
        pass

    @property
    def route(self) -> str:
        return urlsplit(self.path).path.rstrip("/")

    def read_json(self) -> dict[str, Any]:
        """The request's JSON body (recorded); a body that is not a JSON object as `{"_raw": ...}`."""
        length = int(self.headers.get("Content-Length", "0"))
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw or b"{}")
        except ValueError:  # e.g. a compressed body
            body = {"_raw": raw.decode(errors="replace")}
        if not isinstance(body, dict):
            body = {"_raw": body}
        self.server_api.record(self, body, raw)
        return body

    def send_body(self, code: int, data: bytes, content_type: str, headers: dict[str, str]) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header(self.request_id_header, f"req_{secrets.token_hex(8)}")
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    def send_json(self, code: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        self.send_body(code, json.dumps(payload).encode(), "application/json", headers or {})

    def send_events(self, status: int, headers: dict[str, str], frames: Iterable[bytes], event_delay: float) -> None:
        """A streamed answer: each frame one chunk, `event_delay` seconds between two."""
        self.send_response(status)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header(self.request_id_header, f"req_{secrets.token_hex(8)}")
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        try:
            for n, frame in enumerate(frames):
                if n and event_delay and self.server_api.closing.wait(event_delay):
                    self.close_connection = True
                    return
                self.wfile.write(f"{len(frame):x}\r\n".encode() + frame + b"\r\n")
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client went away mid-stream (a cut stream)

    def answer(
        self,
        body: dict[str, Any],
        frames: Callable[[Any, str], Iterable[bytes]],
        whole: Callable[[Any, str], dict[str, Any]],
    ) -> None:
        """Answer with the next turn: as-is (an error), streamed (`frames`) when the request asks
        for a stream, else as one JSON body (`whole`)."""
        t: ScriptedTurn = self.server_api.turn_for(body)
        if t.hang:
            self.server_api.closing.wait()
            self.close_connection = True
            return
        if t.delay and self.server_api.closing.wait(t.delay):
            self.close_connection = True
            return
        model = str(body.get("model", ""))
        if t.raw is not None:
            self.send_body(t.status, t.raw, "application/json", t.headers)
        elif body.get("stream"):
            self.send_events(t.status, t.headers, frames(t, model), t.event_delay)
        else:
            self.send_json(t.status, whole(t, model), t.headers)
        with self.server_api.lock:
            self.server_api.finished_at.append(time.monotonic())


class ScriptedServer(Generic[TurnT]):
    def __init__(
        self, turns: list[TurnT], *, repeat_last: bool, handler: type[ScriptedHandler], exhausted: TurnT, route: str
    ) -> None:
        self.route = route
        self.turns = list(turns)
        self.repeat_last = repeat_last
        self.calls: list[Recorded] = []
        # when the last byte of each scripted answer was written (time.monotonic)
        self.finished_at: list[float] = []
        self.lock = threading.Lock()
        self.closing = threading.Event()
        self._exhausted = exhausted
        bound = type(handler.__name__, (handler,), {"server_api": self})
        self.server = LoopbackServer(("127.0.0.1", 0), bound)
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def posts(self, path: str) -> list[Recorded]:
        """The POST requests to `path`, in order."""
        return [c for c in self.calls if c.method == "POST" and c.path.rstrip("/") == path]

    @property
    def scripted(self) -> list[Recorded]:
        """The requests the script answered (to the server's model route), in order."""
        return self.posts(self.route)

    @property
    def requests(self) -> list[dict[str, Any]]:
        return [c.body for c in self.scripted]

    @property
    def headers(self) -> list[dict[str, str]]:
        return [c.headers for c in self.scripted]

    def record(self, handler: BaseHTTPRequestHandler, body: dict[str, Any], raw: bytes = b"") -> None:
        parts = urlsplit(handler.path)
        with self.lock:
            self.calls.append(
                Recorded(
                    method=handler.command,
                    path=parts.path,
                    query=dict(parse_qsl(parts.query, keep_blank_values=True)),
                    headers={k.lower(): v for k, v in handler.headers.items()},
                    body=body,
                    raw=raw,
                )
            )

    def turn_for(self, body: dict[str, Any]) -> TurnT:
        """The turn that answers this request (a subclass may answer some outside the script)."""
        return self.next_turn()

    def next_turn(self) -> TurnT:
        with self.lock:
            if not self.turns:
                return self._exhausted
            if len(self.turns) > 1 or not self.repeat_last:
                return self.turns.pop(0)
            return self.turns[0]

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.closing.set()
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=10)
