"""Claude Code's `--output-format stream-json` lines, normalised into forgehand's transcript
(docs/transcript.md). Pure: a `StreamState` takes one decoded line at a time and returns the
transcript events it stands for; the runtime emits them and reads what the state gathered (the
session id, the CLI version, the tool calls in flight, the final `result`). A `result` line's
usage (`usage_of`) and, when it ended in an error, the task's error and failure reason
(`error_text`, `failure_of`) are read here too.

Shapes measured with the CLI 2.1.332 (see runtime.py's docstring for the whole protocol):
- `{"type":"system","subtype":"init","session_id","cwd","model","tools","permissionMode",
  "claude_code_version",...}` first;
- `{"type":"assistant","message":{"content":[{"type":"text"|"tool_use"|"thinking",...}],"usage"},
  "parent_tool_use_id": null|"toolu_..", "session_id"}`: one content block per line in practice;
  a subagent's lines carry the `Task` call's id as `parent_tool_use_id` (and an `agent_id`);
- `{"type":"user","message":{"content":[{"type":"tool_result","tool_use_id","content":str|blocks,
  "is_error"}]},"parent_tool_use_id",...}`;
- `{"type":"system","subtype":"task_started"|"task_notification"|"task_updated"|
  "background_tasks_changed",...}` for (background) subagents;
- `{"type":"result","subtype":"success"|"error_...","is_error","result","num_turns","usage",
  "total_cost_usd","session_id","permission_denials",...}`: one per turn; background subagents can
  add more, so the last one is final;
- `control_request` / `control_response` lines belong to the control channel (control.py)."""

from typing import Any

import msgspec

from tasks.core.capping import TOOL_OUTPUT_CAP, cap_text
from tasks.core.states import FailureReason
from tasks.core.transcript import Assistant, Notice, Payload, System, ToolCall, ToolResult
from tasks.run.runtimes.tool_kinds import tool_kind

Event = tuple[str, Payload]


class CallSeen(msgspec.Struct, kw_only=True):
    name: str
    input: Any
    parent: str = ""


def _text_of(content: Any) -> str:
    """A tool result's content: a string, or text blocks (other blocks are named, not inlined)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts: list[str] = []
        for block in content:
            if isinstance(block, dict):
                if block.get("type") == "text" and isinstance(block.get("text"), str):
                    parts.append(block["text"])
                elif block.get("type"):
                    parts.append(f"[{block['type']}]")
        return "\n".join(parts)
    return "" if content is None else str(content)


class StreamState:
    """What the stream has said so far."""

    def __init__(self) -> None:
        self.session_id = ""
        self.version = ""
        self.model = ""
        self.calls: dict[str, CallSeen] = {}
        self.results: list[dict[str, Any]] = []
        self.background: set[str] = set()  # subagent task ids in flight
        self.lines = 0

    @property
    def final(self) -> dict[str, Any] | None:
        return self.results[-1] if self.results else None

    def feed(self, line: dict[str, Any]) -> list[Event]:
        """The transcript events of one stdout line (control lines give none)."""
        self.lines += 1
        kind = line.get("type")
        if isinstance(line.get("session_id"), str) and line["session_id"]:
            self.session_id = line["session_id"]
        if kind == "assistant":
            return self._assistant(line)
        if kind == "user":
            return self._user(line)
        if kind == "system":
            return self._system(line)
        if kind == "result":
            return self._result(line)
        return []

    def _assistant(self, line: dict[str, Any]) -> list[Event]:
        message: dict[str, Any] = line["message"] if isinstance(line.get("message"), dict) else {}
        parent = line.get("parent_tool_use_id") or ""
        events: list[Event] = []
        for block in message.get("content") or []:
            if not isinstance(block, dict):
                continue
            if block.get("type") == "text" and isinstance(block.get("text"), str) and block["text"].strip():
                events.append(("assistant", Assistant(text=block["text"], parent_id=str(parent))))
            elif block.get("type") == "tool_use":
                call_id, name = str(block.get("id") or ""), str(block.get("name") or "")
                self.calls[call_id] = CallSeen(name=name, input=block.get("input"), parent=str(parent))
                events.append(
                    (
                        "tool_call",
                        ToolCall(
                            id=call_id,
                            name=name,
                            input=block.get("input"),
                            kind=tool_kind(name),
                            parent_id=str(parent),
                        ),
                    )
                )
        return events

    def _user(self, line: dict[str, Any]) -> list[Event]:
        message: dict[str, Any] = line["message"] if isinstance(line.get("message"), dict) else {}
        content = message.get("content")
        if not isinstance(content, list):
            return []
        events: list[Event] = []
        for block in content:
            if not isinstance(block, dict) or block.get("type") != "tool_result":
                continue
            call_id = str(block.get("tool_use_id") or "")
            seen = self.calls.get(call_id)
            text, omitted = cap_text(_text_of(block.get("content")), TOOL_OUTPUT_CAP)
            events.append(
                (
                    "tool_result",
                    ToolResult(
                        id=call_id,
                        name=seen.name if seen else "",
                        output=text,
                        is_error=bool(block.get("is_error")),
                        omitted_bytes=omitted,
                        parent_id=str(line.get("parent_tool_use_id") or ""),
                    ),
                )
            )
        return events

    def _system(self, line: dict[str, Any]) -> list[Event]:
        subtype = line.get("subtype")
        if subtype == "init":
            self.version = str(line.get("claude_code_version") or "")
            self.model = str(line.get("model") or "")
            detail = {k: line.get(k) for k in ("session_id", "model", "cwd", "permissionMode", "claude_code_version")}
            text = f"claude-code {self.version} started session {self.session_id} (model {self.model})"
            return [("system", System(phase="agent", text=text, detail=detail))]
        if subtype == "task_started":
            self.background.add(str(line.get("task_id") or ""))
            what = line.get("description") or line.get("subagent_type") or "subagent"
            text = f"subagent started: {what}"
            return [("system", System(phase="subagent", text=text, detail=_pick(line, _TASK_FIELDS)))]
        if subtype == "task_notification":
            self.background.discard(str(line.get("task_id") or ""))
            text = f"subagent {line.get('status') or 'ended'}: {str(line.get('summary') or '')[:500]}"
            return [("system", System(phase="subagent", text=text, detail=_pick(line, _TASK_FIELDS)))]
        if subtype == "background_tasks_changed" and isinstance(line.get("tasks"), list):
            self.background = {str(t.get("task_id") or "") for t in line["tasks"] if isinstance(t, dict)}
            return []
        if subtype == "api_retry":
            text = f"the model call is retried (attempt {line.get('attempt')}, status {line.get('error_status')})"
            return [("notice", Notice(text=text, level="warning"))]
        return []

    def _result(self, line: dict[str, Any]) -> list[Event]:
        self.results.append(line)
        detail = _pick(
            line,
            (
                "subtype",
                "is_error",
                "num_turns",
                "duration_ms",
                "duration_api_ms",
                "total_cost_usd",
                "usage",
                "session_id",
                "stop_reason",
                "terminal_reason",
                "api_error_status",
            ),
        )
        denials = line.get("permission_denials")
        detail["permission_denials"] = len(denials) if isinstance(denials, list) else 0
        subtype = str(line.get("subtype") or "")
        if line.get("is_error"):  # `success` with is_error: a model call failed for good
            text = "claude-code ended with an error" + (f" ({subtype})" if subtype not in ("", "success") else "")
        else:
            text = f"claude-code result: {subtype}"
        return [("system", System(phase="agent_result", text=text, detail=detail))]


_TASK_FIELDS = ("task_id", "tool_use_id", "description", "subagent_type", "status", "is_backgrounded")


def _pick(line: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    return {k: line[k] for k in keys if k in line}


def usage_of(result: dict[str, Any]) -> tuple[int, int]:
    """(prompt tokens with cache reads and writes, output tokens) of a `result` line."""
    usage: dict[str, Any] = result["usage"] if isinstance(result.get("usage"), dict) else {}

    def num(key: str) -> int:
        value = usage.get(key)
        return value if isinstance(value, int) and value >= 0 else 0

    prompt = num("input_tokens") + num("cache_creation_input_tokens") + num("cache_read_input_tokens")
    return prompt, num("output_tokens")


# How a `result` line's error subtypes read for a person (`success` with `is_error`: a model call
# failed for good; the result text says why).
_ENDINGS = {
    "error_max_turns": "it reached its turn limit",
    "error_max_budget_usd": "it reached its cost budget",
    "error_during_execution": "an error during execution",
}


def error_text(result: dict[str, Any]) -> str:
    """The task's error for a `result` line that ended in an error: never its subtype `success`."""
    subtype = str(result.get("subtype") or "")
    why = _ENDINGS.get(subtype, "" if subtype in ("", "success") else subtype.replace("_", " "))
    said = str(result.get("result") or "").strip()[:2000]
    head = f"claude ended with an error ({why})" if why else "claude ended with an error"
    return f"{head}: {said}" if said else head


_UNREACHABLE = ("connection", "econnrefused", "etimedout", "enotfound", "timed out", "socket")


def failure_of(result: dict[str, Any]) -> FailureReason:
    """The typed reason of an error `result`. Measured: a model call that failed for good ends
    with `terminal_reason` `api_error` and `result` "API Error: 500 ..." / "API Error: Request
    rejected (429) ..." / "API Error: Connection refused ... (ECONNREFUSED)"."""
    subtype = str(result.get("subtype") or "")
    if subtype == "error_max_turns":
        return FailureReason.TURN_LIMIT
    if subtype == "error_max_budget_usd":
        return FailureReason.TOKEN_BUDGET
    text = str(result.get("result") or "").lower()
    status = result.get("api_error_status")
    if result.get("terminal_reason") == "api_error" or text.startswith("api error") or isinstance(status, int):
        if isinstance(status, int) and status in (502, 503, 504):
            return FailureReason.MODEL_UNREACHABLE
        return FailureReason.MODEL_UNREACHABLE if any(w in text for w in _UNREACHABLE) else FailureReason.MODEL_ERROR
    return FailureReason.EXIT_CODE
