"""ACP `session/update` notifications normalised into forgehand's transcript (the kinds the
claude-code runtime emits), and the permission option a decision picks. Pure: `UpdateState.feed`
takes one update and returns the events it stands for.

- `agent_message_chunk` text is gathered and becomes one `assistant` event when something else
  happens (a tool call, the end of the turn): an agent streams a word at a time; a message over
  `PART` characters (64 Ki) is shown in parts, none cut (nothing gathers without end);
- `agent_thought_chunk` likewise becomes a `system` event of phase `thought`;
- `tool_call` becomes `tool_call` (its name is the adapter's tool name when `_meta` names one,
  else the title; `kind` is ACP's), held until its input is complete (the first update with a
  status, a permission request for it, its result or the end of the turn) so the transcript shows
  the input that ran; `tool_call_update` with status `completed`/`failed` becomes `tool_result`;
- `plan` becomes a `system` event of phase `plan`; `usage_update` is kept (the last one) and shown
  with the turn's end; mode, command and session-info updates are not transcript events."""

from collections.abc import Callable
from typing import Any

import msgspec

from tasks.core.capping import TOOL_OUTPUT_CAP, cap_text
from tasks.core.transcript import Assistant, Kind, Payload, System, ToolCall, ToolResult

Event = tuple[Kind, Payload]
TEXT_CAP = 256 * 1024
PART = TEXT_CAP // 4  # characters: a part is at most TEXT_CAP bytes of UTF-8, never cut
KNOWN_OPTION_KINDS = ("allow_once", "allow_always", "reject_once", "reject_always")


class CallSeen(msgspec.Struct, kw_only=True):
    name: str
    kind: str
    input: Any = None
    shown: bool = False
    done: bool = False
    pinned: bool = False  # name and input from the managed hook: what the policy saw


def tool_name_of(call: dict[str, Any]) -> str:
    """The adapter's own tool name (`_meta.claudeCode.toolName`, `_meta.toolName`), else the title."""
    meta = call.get("_meta")
    if isinstance(meta, dict):
        for value in meta.values():
            if isinstance(value, dict) and isinstance(value.get("toolName"), str) and value["toolName"]:
                return str(value["toolName"])[:200]
        if isinstance(meta.get("toolName"), str) and meta["toolName"]:
            return str(meta["toolName"])[:200]
    for key in ("title", "kind"):
        if isinstance(call.get(key), str) and call[key]:
            return str(call[key])[:200]
    return "tool"


def _content_text(content: Any) -> str:
    """A tool call's `content` (content blocks, diffs, terminals) or a single content block, as text."""
    if isinstance(content, dict):
        content = [content]
    if not isinstance(content, list):
        return ""
    parts: list[str] = []
    for item in content:
        if not isinstance(item, dict):
            continue
        inner = item.get("content") if item.get("type") == "content" else item
        if isinstance(inner, dict) and inner.get("type") == "text" and isinstance(inner.get("text"), str):
            parts.append(inner["text"])
        elif item.get("type") == "diff":
            parts.append(f"[diff {item.get('path')}]\n{item.get('newText') or ''}")
        elif item.get("type") == "terminal":
            parts.append(f"[terminal {item.get('terminalId')}]")
        elif isinstance(inner, dict) and inner.get("type"):
            parts.append(f"[{inner['type']}]")
    return "\n".join(parts)


def _output_of(update: dict[str, Any]) -> str:
    text = _content_text(update.get("content"))
    if not text and "rawOutput" in update:
        raw = update["rawOutput"]
        text = raw if isinstance(raw, str) else msgspec.json.encode(raw).decode()
    return text


class _Gathered:
    """Streamed text of one kind (the message, the thoughts), joined into one event when something
    else happens or a part is full: an agent streaming chunks and nothing else must not grow the
    worker's memory without end."""

    def __init__(self, make: Callable[[str], Event]) -> None:
        self.make = make
        self.parts: list[str] = []
        self.size = 0  # characters

    def add(self, chunk: str) -> list[Event]:
        events = self.take() if self.size + len(chunk) > PART else []
        self.parts.append(chunk)
        self.size += len(chunk)
        return events

    def take(self) -> list[Event]:
        if not self.parts:  # the common case, a tool update after another: nothing to join
            return []
        text, self.parts, self.size = "".join(self.parts), [], 0
        return [self.make(cap_text(text, TEXT_CAP)[0])] if text.strip() else []


class UpdateState:
    """What the updates have said so far in one run."""

    def __init__(self) -> None:
        self.calls: dict[str, CallSeen] = {}
        self._text = _Gathered(lambda text: ("assistant", Assistant(text=text)))
        self._thought = _Gathered(lambda text: ("system", System(phase="thought", text=text)))
        self.usage: dict[str, Any] | None = None
        self.updates = 0
        self.replaying = False  # session/load replays the history: not shown again

    def feed(self, update: Any) -> list[Event]:
        self.updates += 1
        if not isinstance(update, dict) or self.replaying:
            return []
        kind = update.get("sessionUpdate")
        if kind == "agent_message_chunk":
            return self._thought.take() + self._text.add(_content_text(update.get("content")))
        if kind == "agent_thought_chunk":
            return self._text.take() + self._thought.add(_content_text(update.get("content")))
        events = self.flush()
        if kind in ("tool_call", "tool_call_update"):
            return events + self._tool_call(update)
        if kind == "plan":
            entries: list[Any] = update["entries"] if isinstance(update.get("entries"), list) else []
            lines = [
                f"[{e.get('status') or 'pending'}] {e.get('content') or ''}" for e in entries if isinstance(e, dict)
            ]
            plan = System(phase="plan", text="\n".join(lines)[:8000], detail={"entries": entries[:100]})
            return [*events, ("system", plan)]
        if kind == "usage_update":
            self.usage = {k: update[k] for k in ("used", "size", "cost") if k in update}
        return events

    def flush(self) -> list[Event]:
        """Gathered text, and the tool calls not shown yet (the end of a turn)."""
        return self._thought.take() + self._text.take()

    def pending_calls(self) -> list[Event]:
        return [e for call_id in list(self.calls) for e in self.show(call_id)]

    def show(self, call_id: str) -> list[Event]:
        """The `tool_call` event of a call not shown yet (its input is as complete as it gets)."""
        seen = self.calls.get(call_id)
        if seen is None or seen.shown:
            return []
        seen.shown = True
        return [("tool_call", ToolCall(id=call_id, name=seen.name, input=seen.input, kind=seen.kind))]

    def see(self, call: dict[str, Any]) -> CallSeen:
        call_id = str(call.get("toolCallId") or "")
        seen = self.calls.get(call_id)
        if seen is None:
            seen = CallSeen(name=tool_name_of(call), kind=str(call.get("kind") or "other"))
            self.calls[call_id] = seen
        elif not seen.shown:
            if (call.get("title") or call.get("_meta")) and not seen.pinned:
                named = tool_name_of(call)
                seen.name = named if named != "tool" else seen.name
            if isinstance(call.get("kind"), str):
                seen.kind = call["kind"]
        if "rawInput" in call and not seen.shown and not seen.pinned:
            seen.input = call["rawInput"]
        return seen

    def pin(self, call_id: str, name: str, tool_input: Any, kind: str) -> CallSeen:
        """A call the managed hook decided: the transcript shows it with the hook's name and input
        (the policy record's), whatever the adapter's updates call it later."""
        seen = self.calls.setdefault(call_id, CallSeen(name=name, kind=kind))
        if not seen.shown:
            seen.name, seen.input, seen.pinned = name, tool_input, True
        return seen

    def _tool_call(self, update: dict[str, Any]) -> list[Event]:
        call_id = str(update.get("toolCallId") or "")
        self.see(update)
        if update.get("status") in ("in_progress", "completed", "failed"):
            return self.show(call_id) + self._result(call_id, update)
        return []

    def _result(self, call_id: str, update: dict[str, Any]) -> list[Event]:
        seen = self.calls[call_id]
        if update.get("status") not in ("completed", "failed") or seen.done:
            return []
        seen.done = True
        text, omitted = cap_text(_output_of(update), TOOL_OUTPUT_CAP)
        result = ToolResult(
            id=call_id, name=seen.name, output=text, is_error=update.get("status") == "failed", omitted_bytes=omitted
        )
        return [("tool_result", result)]


def choose_option(options: Any, allow: bool) -> tuple[dict[str, Any], bool, str]:
    """The `session/request_permission` outcome for a decision, chosen by option kind, never by
    position: allow takes an `allow_once` option, deny a `reject_once`; an allow with no
    `allow_once` is refused like a deny; with no `reject_once` either (no options, unknown kinds,
    only `allow_always` or `reject_always`) the answer is `cancelled`, which the agent takes as not
    permitted. `allow_always` is never chosen: it would let later calls run without asking.
    Returns the outcome, whether it permits the call, and a note for the transcript ("" when
    nothing is odd)."""
    offered = [o for o in options if isinstance(o, dict)] if isinstance(options, list) else []
    kinds = [str(o.get("kind")) for o in offered]
    # An id offered twice could mean either option to the agent: neither is chosen.
    ids = [o.get("optionId") for o in offered]
    offered = [o for o in offered if ids.count(o.get("optionId")) == 1]
    unknown = sorted({k for k in kinds if k not in KNOWN_OPTION_KINDS})
    note = f"unknown option kinds ignored: {', '.join(unknown)}. " if unknown else ""
    if allow:
        for option in offered:
            if option.get("kind") == "allow_once" and isinstance(option.get("optionId"), str) and option["optionId"]:
                return {"outcome": "selected", "optionId": option["optionId"]}, True, note.strip()
        note += f"allowed, but the agent offered no allow_once option ({', '.join(kinds) or 'none'}): refused. "
    for option in offered:
        if option.get("kind") == "reject_once" and isinstance(option.get("optionId"), str) and option["optionId"]:
            return {"outcome": "selected", "optionId": option["optionId"]}, False, note.strip()
    note += f"no reject_once option ({', '.join(kinds) or 'no options'}): answered cancelled"
    return {"outcome": "cancelled"}, False, note.strip()
