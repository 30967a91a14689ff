"""Codex runs against a stand-in gateway (tests/support/channel.py's FakeChannel): a scripted
OpenAI Responses model on `POST /v1/responses` (streamed as the API frames it, the subset Codex
reads: `response.created`, `response.output_item.added|done`, `response.completed` with usage) and
the run's hook calls handed to the runtime's registered handler, or answered with a fixed fault.

    with CodexChannel(channel_dir, [[exec_call("touch x")], [message("done")]], loop) as ch:
        outcome = await CodexRuntime().run(host_context(sb, gate, emit, channel=ch))
        ch.requests  # the /v1/responses bodies
"""

import asyncio
import itertools
import json
import secrets
from pathlib import Path
from typing import Any

from tests.support.channel import FakeChannel, HookCall, Reply, reply_json
from tests.support.claude_host import Provider

MODEL = "gpt-5.5"  # a model Codex 0.171.0 knows: it offers apply_patch for it
USAGE = {
    "input_tokens": 120,
    "input_tokens_details": {"cached_tokens": 20},
    "output_tokens": 9,
    "output_tokens_details": {"reasoning_tokens": 3},
    "total_tokens": 129,
}


def message(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}


def exec_call(cmd: str, call_id: str = "") -> dict[str, Any]:
    call_id = call_id or f"call_{secrets.token_hex(6)}"
    return {"type": "function_call", "name": "exec_command", "arguments": json.dumps({"cmd": cmd}), "call_id": call_id}


def patch_call(patch: str, call_id: str = "") -> dict[str, Any]:
    call_id = call_id or f"call_{secrets.token_hex(6)}"
    return {"type": "custom_tool_call", "name": "apply_patch", "input": patch, "call_id": call_id}


def add_file(path: str, text: str) -> str:
    body = "".join(f"+{line}\n" for line in text.splitlines())
    return f"*** Begin Patch\n*** Add File: {path}\n{body}*** End Patch\n"


def sse(items: list[dict[str, Any]], response_id: str) -> list[bytes]:
    seq = itertools.count()
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": {"id": response_id, "status": "in_progress"}}
    ]
    for i, item in enumerate(items):
        events.append({"type": "response.output_item.added", "output_index": i, "item": item})
        events.append({"type": "response.output_item.done", "output_index": i, "item": item})
    events.append(
        {"type": "response.completed", "response": {"id": response_id, "status": "completed", "usage": USAGE}}
    )
    out = []
    for event in events:
        event["sequence_number"] = next(seq)
        out.append(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode())
    return out


def tool_outputs(requests: list[dict[str, Any]]) -> dict[str, str]:
    """What the model was told of each call: call id -> output text, from the later requests."""
    seen: dict[str, str] = {}
    for body in requests:
        for item in body.get("input") or []:
            if item.get("type") in ("function_call_output", "custom_tool_call_output"):
                output = item.get("output")
                seen[item["call_id"]] = output if isinstance(output, str) else json.dumps(output)
    return seen


class CodexChannel:
    """The runtime's channel face over a FakeChannel serving the scripted Responses turns."""

    container_dir = "/run/forgehand"
    container_socket = "/run/forgehand/gateway.sock"

    def __init__(
        self,
        directory: Path,
        turns: list[list[dict[str, Any]]],
        loop: asyncio.AbstractEventLoop,
        *,
        fault: Reply | None = None,
    ) -> None:
        self.handler: Any = None
        self.loop = loop
        self.turns = list(turns)
        self.fault = fault  # every hook call answered with this (the runtime is not asked)
        self.requests: list[dict[str, Any]] = []
        self.fake = FakeChannel(directory, hook=self._hook, stream=self._stream)
        self.token = self.fake.token
        self.provider = Provider(openai_model=MODEL)

    def __enter__(self) -> "CodexChannel":
        self.fake.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.fake.__exit__(*exc)

    @property
    def hooks(self) -> list[HookCall]:
        return self.fake.hooks

    def set_hook_handler(self, fn: Any) -> None:
        self.handler = fn

    def _hook(self, call: HookCall) -> Reply:
        if self.fault is not None:
            return self.fault
        if self.handler is None:
            return reply_json({"error": "no hook handler"}, 503)
        future = asyncio.run_coroutine_threadsafe(self.handler(call.agent, call.event, call.body), self.loop)
        return reply_json(future.result(timeout=120))

    def _stream(self, path: str, body: dict[str, Any]) -> list[bytes] | None:
        if path != "/v1/responses":
            return None
        self.requests.append(body)
        items = self.turns.pop(0) if self.turns else [message("(script exhausted)")]
        return sse(items, f"resp_{len(self.requests)}")
