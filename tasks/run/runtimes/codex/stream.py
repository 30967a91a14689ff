"""Codex's `codex exec --json` lines, normalised into forgehand's transcript (docs/transcript.md).
Pure: a `StreamState` takes one decoded line at a time and returns the transcript events it stands
for; the runtime emits them and reads what the state gathered (the thread id, the usage, the last
agent message, how the turn ended).

Shapes measured with the CLI 0.171.0 (against a scripted Responses server):
- `{"type":"thread.started","thread_id":UUID}` first (a resumed thread keeps its id), then
  `{"type":"turn.started"}`;
- `{"type":"item.started"|"item.updated"|"item.completed","item":{"id":"item_N","type":...}}` with
  item types `command_execution` (`command`, `aggregated_output`, `exit_code`, `status`
  in_progress|completed|failed|declined), `file_change` (`changes: [{path, kind add|delete|update}]`,
  `status`), `agent_message` (`text`), `reasoning` (`text`), `mcp_tool_call` (`server`, `tool`,
  `arguments`, `result`, `error`, `status`), `web_search` (`query`), `todo_list` (`items`) and
  `error` (`message`: a warning such as unknown model metadata, not the end of the turn);
- `{"type":"turn.completed","usage":{"input_tokens","cached_input_tokens",
  "cache_write_input_tokens","output_tokens","reasoning_output_tokens"}}` ends the turn, or
  `{"type":"turn.failed","error":{"message"}}`; `{"type":"error","message"}` reports a fatal error.
- A call a PreToolUse hook blocked never appears here: the runtime records it from the hook.
- The item ids (`item_0`...) are not the tool call ids the hooks see (`call_...`), and a
  `file_change` carries the paths, not the patch. The runtime tells the state each call its hook
  allowed (`allowed`); an item is matched to one by content (a command line that holds the hook's
  command, a change list whose paths the patch names) and is recorded with the call's id, name and
  exact input, as the policy saw it. An item no allowed call matches keeps its own id and shape."""

import shlex
from collections import deque
from collections.abc import Sequence
from typing import Any

import msgspec

from tasks.core.capping import TOOL_OUTPUT_CAP, HeadTail, cap_text
from tasks.core.transcript import Assistant, Kind, Notice, Payload, System, ToolCall, ToolResult
from tasks.run.runtimes.cli_lines import json_object, keep_lines

Event = tuple[Kind, Payload]


class Allowed(msgspec.Struct, frozen=True, kw_only=True):
    """A call the managed hook let run: what the policy saw."""

    id: str
    name: str
    input: Any


class Ran(msgspec.Struct, frozen=True, kw_only=True):
    """A tool item that completed: the call its hook allowed (`id` "" when none matched)."""

    id: str
    name: str
    error: bool


def _words(command: str) -> list[str]:
    try:
        return shlex.split(command)
    except ValueError:
        return []


def _matches(allowed: Allowed, item: dict[str, Any]) -> bool:
    given = allowed.input.get("command") if isinstance(allowed.input, dict) else None
    if item.get("type") == "command_execution":
        command = str(item.get("command") or "")
        # The item shows the command as Codex ran it (`/bin/bash -lc '<command>'`, quoted).
        runs = isinstance(given, str) and (given in command or given in _words(command))
        return allowed.name == "Bash" and runs
    if item.get("type") == "mcp_tool_call":
        name = f"mcp__{item.get('server') or ''}__{item.get('tool') or ''}"
        return allowed.name == name and allowed.input == item.get("arguments")
    if item.get("type") == "file_change":
        changes = item.get("changes") if isinstance(item.get("changes"), list) else []
        paths = [str(c.get("path") or "") for c in changes if isinstance(c, dict)]  # type: ignore[union-attr]
        return allowed.name == "apply_patch" and isinstance(given, str) and all(p and p in given for p in paths)
    return False


def _int(value: Any) -> int:
    return value if isinstance(value, int) and value >= 0 else 0


class StreamState:
    """What the stream has said so far (one CLI process)."""

    def __init__(self, version: str = "") -> None:
        self.session_id = ""  # the thread id
        self.version = version
        self.turns = 0
        self.completed = 0  # turn.completed lines
        self.failure = ""  # turn.failed / error message
        self.last_message = ""
        self.input_tokens = 0
        self.output_tokens = 0
        self.usage: dict[str, int] = {}
        self.lines = 0
        self._open: set[str] = set()  # items started and not completed
        self._allowed: deque[Allowed] = deque(maxlen=256)  # allowed calls not yet seen in the stream
        self._matched: dict[str, Allowed] = {}  # item id -> its call
        # Tool items that completed since the runtime last took them (`take_ran`): each is checked
        # against the decisions (ledger.py); provider-side web searches are the gateway's to refuse.
        self.ran: list[Ran] = []

    def take_ran(self) -> list[Ran]:
        ran, self.ran = self.ran, []
        return ran

    def allowed(self, call: Allowed) -> None:
        self._allowed.append(call)

    def _call_of(self, item_id: str, item: dict[str, Any]) -> Allowed | None:
        known = self._matched.get(item_id)
        if known is not None:
            return known
        for call in self._allowed:
            if _matches(call, item):
                self._allowed.remove(call)
                self._matched[item_id] = call
                return call
        return None

    @property
    def final(self) -> bool:
        """The turn ended (completed or failed): the process should exit now."""
        return self.completed > 0 or bool(self.failure)

    def feed_lines(self, lines: Sequence[bytes], kept: HeadTail) -> list[Event]:
        """Lines read together, each kept for the raw artefact and decoded: their events in order (the codex
        runtime's whole path for stdout, which the ingest bench drives)."""
        keep_lines(lines, kept)
        out: list[Event] = []
        for raw in lines:
            line = json_object(raw)
            if line is not None:
                out += self.feed(line)
        return out

    def feed(self, line: dict[str, Any]) -> list[Event]:
        self.lines += 1
        kind = line.get("type")
        if kind == "thread.started":
            self.session_id = str(line.get("thread_id") or self.session_id)
            text = f"codex {self.version or '?'} started thread {self.session_id}"
            return [("system", System(phase="agent", text=text, detail={"thread_id": self.session_id}))]
        if kind == "turn.started":
            self.turns += 1
            return []
        if kind in ("item.started", "item.updated", "item.completed"):
            item = line.get("item")
            return self._item(str(kind), item) if isinstance(item, dict) else []
        if kind == "turn.completed":
            return self._completed(line)
        if kind == "turn.failed":
            error = line.get("error")
            self.failure = str(error.get("message") if isinstance(error, dict) else error or "the turn failed")
            return [("notice", Notice(text=f"codex: the turn failed: {self.failure[:2000]}", level="error"))]
        if kind == "error":
            self.failure = str(line.get("message") or "error")
            return [("notice", Notice(text=f"codex: {self.failure[:2000]}", level="error"))]
        return []

    def _completed(self, line: dict[str, Any]) -> list[Event]:
        self.completed += 1
        usage: dict[str, Any] = line["usage"] if isinstance(line.get("usage"), dict) else {}
        turn = {k: _int(v) for k, v in usage.items()}
        for key, value in turn.items():
            self.usage[key] = self.usage.get(key, 0) + value
        # input_tokens includes the cached ones (the Responses API's convention).
        self.input_tokens += turn.get("input_tokens", 0) + turn.get("cache_write_input_tokens", 0)
        self.output_tokens += turn.get("output_tokens", 0)
        detail = {"usage": turn, "thread_id": self.session_id}
        return [("system", System(phase="agent_result", text="codex turn completed", detail=detail))]

    def _item(self, kind: str, item: dict[str, Any]) -> list[Event]:
        item_id, item_type = str(item.get("id") or ""), item.get("type")
        started, done = kind == "item.started", kind == "item.completed"
        if item_type == "agent_message":
            text = str(item.get("text") or "")
            if not done or not text.strip():
                return []
            self.last_message = text
            return [("assistant", Assistant(text=text))]
        if item_type == "reasoning":
            text = str(item.get("text") or "")
            return [("system", System(phase="reasoning", text=text[:4000]))] if done and text.strip() else []
        if item_type == "error":
            text = f"codex: {item.get('message') or 'error'}"
            return [("notice", Notice(text=text, level="warning"))] if done else []
        if item_type == "todo_list":
            return []
        call = self._call(item_id, item)
        if call is None:
            return []
        seen = self._call_of(item_id, item)
        if seen is not None:  # as the policy saw it
            call = ToolCall(id=seen.id, name=seen.name, input=seen.input, kind=call.kind)
        events: list[Event] = []
        if started or (done and item_id not in self._open):
            self._open.add(item_id)
            events.append(("tool_call", call))
        if done:
            self._open.discard(item_id)
            result = self._result(call.id, call.name, item)
            events.append(("tool_result", result))
            self._matched.pop(item_id, None)
            if item_type != "web_search" and item.get("status") != "declined":
                self.ran.append(Ran(id=seen.id if seen else "", name=call.name, error=result.is_error))
        return events

    def _call(self, item_id: str, item: dict[str, Any]) -> ToolCall | None:
        item_type = item.get("type")
        if item_type == "command_execution":
            return ToolCall(id=item_id, name="exec_command", input={"command": item.get("command")}, kind="execute")
        if item_type == "file_change":
            return ToolCall(id=item_id, name="apply_patch", input={"changes": item.get("changes")}, kind="edit")
        if item_type == "mcp_tool_call":
            name = f"mcp__{item.get('server') or ''}__{item.get('tool') or ''}"
            return ToolCall(id=item_id, name=name, input=item.get("arguments"), kind="other")
        if item_type == "web_search":
            return ToolCall(id=item_id, name="web_search", input={"query": item.get("query")}, kind="fetch")
        return None

    def _result(self, item_id: str, name: str, item: dict[str, Any]) -> ToolResult:
        status = str(item.get("status") or "")
        item_type = item.get("type")
        if item_type == "command_execution":
            output = str(item.get("aggregated_output") or "")
            exit_code = item.get("exit_code")
            failed = status in ("failed", "declined") or (isinstance(exit_code, int) and exit_code != 0)
            if isinstance(exit_code, int) and exit_code != 0:
                output = f"{output}\n(exit code {exit_code})" if output else f"(exit code {exit_code})"
        elif item_type == "file_change":
            listed = item.get("changes")
            changes: list[Any] = listed if isinstance(listed, list) else []
            output = "\n".join(f"{c.get('kind', '?')} {c.get('path', '?')}" for c in changes if isinstance(c, dict))
            failed = status == "failed"
        elif item_type == "mcp_tool_call":
            error = item.get("error")
            output = str(error.get("message") if isinstance(error, dict) else item.get("result") or "")
            failed = status == "failed" or error is not None
        else:
            output, failed = "", status == "failed"
        text, omitted = cap_text(output, TOOL_OUTPUT_CAP)
        return ToolResult(id=item_id, name=name, output=text, is_error=failed, omitted_bytes=omitted)
