"""The reference consumer behind `forgehand hooks serve` (standard library and PyJWT only).

It logs one JSON line per request, denies tools whose name matches `--deny-tool-pattern`, answers
`ask` (a person decides on the task page) for tool calls matching `--ask-tool-pattern` (see
`call_subjects`), remembering each decision per task and `tool_use_id` under one lock, so a
duplicate delivery gets the same answer, and redacts prompt text matching
`--redact-prompt-pattern` through an `allow` with an `input_override`. A deny wins over an ask.
With `--log-only` it never answers with a decision.
"""

import json
import re
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import IO, Any

from webhooks.sdk.consumer import Consumer, allow, ask, deny
from webhooks.sdk.protocol import POLICY_EVENTS
from webhooks.sdk.verifier import HookRequest, VerificationError, Verifier

REDACTED = "[redacted]"


def call_subjects(tool: str, tool_input: Any) -> list[str]:
    """What `--ask-tool-pattern` is searched in: the tool name, and for a tool whose input has a
    `command` (a string, or a list of strings joined with spaces: the shell tools of every runtime)
    also `<tool name>: <command>`. So `^Bash$` asks for every Bash call and `^Bash: git push` only
    for those that push."""
    subjects = [tool]
    command = tool_input.get("command") if isinstance(tool_input, dict) else None
    if isinstance(command, list) and all(isinstance(part, str) for part in command):
        command = " ".join(command)
    if isinstance(command, str):
        subjects.append(f"{tool}: {command}")
    return subjects


class ReferencePolicy:
    def __init__(
        self,
        *,
        deny_tool: re.Pattern[str] | None = None,
        ask_tool: re.Pattern[str] | None = None,
        redact_prompt: re.Pattern[str] | None = None,
        log_only: bool = False,
        out: IO[str] | None = None,
    ) -> None:
        self.deny_tool = deny_tool
        self.ask_tool = ask_tool
        self.redact_prompt = redact_prompt
        self.log_only = log_only
        self.out = out or sys.stdout
        self._decisions: dict[tuple[str, str], dict[str, Any] | None] = {}
        self._lock = threading.Lock()
        self._out_lock = threading.Lock()

    def emit(self, record: dict[str, Any]) -> None:
        line = json.dumps({"at": round(time.time(), 3), **record}, ensure_ascii=False, default=str)
        with self._out_lock:
            self.out.write(line + "\n")
            self.out.flush()

    def _base(self, req: HookRequest) -> dict[str, Any]:
        return {"event": req.type, "wid": req.wid, "task": req.task_id, "repository": req.meta.get("repository")}

    def pre_tool_use(self, req: HookRequest) -> dict[str, Any] | None:
        tool = str(req.data.get("tool_name", ""))
        key = (str(req.task_id), str(req.data.get("tool_use_id", "")))
        with self._lock:
            if key in self._decisions:
                answer = self._decisions[key]
                remembered = True
            else:
                answer = self._decide(tool, req.data.get("tool_input"))
                self._decisions[key] = answer
                remembered = False
        decision = answer["permission"]["decision"] if answer else None
        self.emit(
            {
                **self._base(req),
                "tool_name": tool,
                "decision": decision,
                "remembered": remembered,
                "log_only": self.log_only,
            }
        )
        return None if self.log_only else answer

    def _decide(self, tool: str, tool_input: Any) -> dict[str, Any] | None:
        if self.deny_tool is not None and self.deny_tool.search(tool):
            return deny(f"tool {tool!r} matches the deny pattern {self.deny_tool.pattern!r}")
        if self.ask_tool is not None:
            for subject in call_subjects(tool, tool_input):
                if self.ask_tool.search(subject):
                    shown = subject if len(subject) <= 200 else subject[:199] + "…"
                    return ask(f"{shown!r} matches the ask pattern {self.ask_tool.pattern!r}: a person decides")
        return None

    def user_prompt_submit(self, req: HookRequest) -> dict[str, Any] | None:
        prompt = req.data.get("prompt")
        answer = None
        if self.redact_prompt is not None and isinstance(prompt, str) and self.redact_prompt.search(prompt):
            answer = allow({"prompt": self.redact_prompt.sub(REDACTED, prompt)})
        self.emit({**self._base(req), "redacted": answer is not None, "log_only": self.log_only})
        return None if self.log_only else answer

    def other(self, req: HookRequest) -> None:
        self.emit(self._base(req))

    def log(self, record: dict[str, Any]) -> None:
        self.emit(record)

    def callbacks(self) -> dict[str, Callable[[HookRequest], Any]]:
        table: dict[str, Callable[[HookRequest], Any]] = dict.fromkeys(POLICY_EVENTS, self.other)
        table["pre_tool_use"] = self.pre_tool_use
        table["user_prompt_submit"] = self.user_prompt_submit
        return table


def make_consumer(
    *,
    audience: str,
    secrets: list[str],
    issuer: str | None = None,
    deny_tool_pattern: str | None = None,
    ask_tool_pattern: str | None = None,
    redact_prompt_pattern: str | None = None,
    log_only: bool = False,
    out: IO[str] | None = None,
) -> Consumer:
    policy = ReferencePolicy(
        deny_tool=re.compile(deny_tool_pattern) if deny_tool_pattern else None,
        ask_tool=re.compile(ask_tool_pattern) if ask_tool_pattern else None,
        redact_prompt=re.compile(redact_prompt_pattern) if redact_prompt_pattern else None,
        log_only=log_only,
        out=out,
    )
    verifier = Verifier(audience=audience, secrets=secrets, issuer=issuer)
    return Consumer(verifier, policy=policy.callbacks(), notify=policy.other, log=policy.log)


class _Handler(BaseHTTPRequestHandler):
    consumer: Consumer
    server_version = "forgehand-hooks"
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        return  # one JSON line per request comes from the consumer

    def _send(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _refuse(self, status: int, code: str) -> None:
        self.close_connection = True
        self._send(status, [("Content-Type", "application/json")], json.dumps({"error": code}).encode())

    def _any(self) -> None:
        headers = list(self.headers.items())
        verifier = self.consumer.verifier
        try:
            verifier.verify_headers(self.command, headers)
        except VerificationError as exc:
            self.consumer.prepare(self.command, headers, b"")  # logs the rejection
            self._refuse(exc.status, exc.code)
            return
        raw_length = self.headers.get("Content-Length")
        if raw_length is None or not raw_length.strip().isdigit():
            self._refuse(411, "length_required")
            return
        length = int(raw_length)
        if length > verifier.max_body:
            self._refuse(413, "body_too_large")
            return
        body = self.rfile.read(length)
        response = self.consumer.handle(self.command, headers, body)
        self._send(response.status, response.headers, response.body)

    do_POST = _any  # noqa: N815
    do_GET = _any  # noqa: N815
    do_PUT = _any  # noqa: N815
    do_DELETE = _any  # noqa: N815
    do_PATCH = _any  # noqa: N815


def make_server(consumer: Consumer, host: str = "127.0.0.1", port: int = 0) -> ThreadingHTTPServer:
    handler = type("ConsumerHandler", (_Handler,), {"consumer": consumer})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    return server
