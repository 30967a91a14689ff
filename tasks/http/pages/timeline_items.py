"""The timeline's items (tasks/http/pages/timeline.py), one per stored event: prompts, assistant
messages (sanitised markdown, cached by text), tool calls and results (their fields and outcome
from `tool_cards.py`), stdout/stderr, policy decisions with their endpoints, the phases of a run,
model calls, custom tool runs (a line each: what changed, its state, its output tail folded), and
a generic item for kinds this page does not know (newer producers add kinds). Each kind is
dispatched by name: an unknown kind is only ever the generic item (a few facts), never a call, an
approval or a question.
`Item` carries what the template reads, its element's attributes and time built here, not in a
macro (it is on every item)."""

import functools
import json
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from markupsafe import Markup, escape

from forge.core.text import plural
from forge.http.pages.render import markdown
from tasks.core.states import ToolRunState
from tasks.core.transcript import EventRead
from tasks.http.pages.pauses import Pause
from tasks.http.pages.tool_cards import Field, Text, ToolResultView, json_text, one_line, result_view, tool_fields

# Rendered messages kept (by text) between page renders: at most about 4 MB of source text.
MARKDOWN_CACHE_SIZE = 1024
MARKDOWN_CACHE_CHARS = 4096


@dataclass
class Phase:
    name: str
    text: str
    duration_ms: int | None
    files: list[str] = field(default_factory=list)
    container: str = ""  # the sandbox's full container name (the text shows it shortened)
    log: str = ""  # an environment build's setup log (shown folded)

    @property
    def took(self) -> str:
        return duration(self.duration_ms)


@dataclass
class Endpoint:
    url: str
    result: str
    decision: str
    status: int | None
    latency_ms: float | None


@dataclass
class Item:
    # prompt, assistant, tool, result, output, phases, policy, notice, summary, question, model,
    # tool_run, generic
    kind: str
    seq: int
    run: int | None
    at: datetime
    text: str = ""
    html: Markup | None = None
    label: str = ""  # prompt source and author, notice level, output stream, generic kind
    # tool
    tool_id: str = ""
    name: str = ""
    hint: str = ""
    fields: list[Field] = field(default_factory=list)
    result: ToolResultView | None = None
    # tool: the policy decisions about the call, `pre_tool_use` (before it) and `post_tool_use`
    before: list["Item"] = field(default_factory=list)
    after: list["Item"] = field(default_factory=list)
    # output
    chunks: list[tuple[int, str]] = field(default_factory=list)
    # phases
    phases: list[Phase] = field(default_factory=list)
    # policy
    decision: str = ""
    event: str = ""
    reason: str = ""
    endpoints: list[Endpoint] = field(default_factory=list)
    # generic: the payload's other scalar fields, one line
    facts: list[tuple[str, str]] = field(default_factory=list)
    # tool: the person this call waits (or waited) for; question: its own pause when no call shows it
    pause: Pause | None = None
    # tool_run: the custom tool run's id (its approval card's anchor) and its output tail
    tool_run_id: int = 0
    tail: Text | None = None
    last_seq: int = 0

    @functools.cached_property
    def output(self) -> Text:
        """An output item's chunks as one text (read once the item is built: merging is over)."""
        return Text("".join(t for _, t in self.chunks))

    def attrs(self, cls: str) -> Markup:
        """The item element's attributes: its anchor, classes, event numbers, run and kind (what
        the live script reads). Built here, not in a template macro: it is on every item."""
        run = "" if self.run is None else self.run
        return Markup(  # noqa: S704 (`cls` is escaped; the rest are numbers and a fixed word)
            f'id="ev-{self.seq}" class="ti {escape(cls)}" data-seq="{self.seq}" '
            f'data-last-seq="{self.last_seq}" data-run="{run}" data-kind="{self.kind}"'
        )

    @property
    def when(self) -> Markup:
        at = self.at
        return Markup(  # noqa: S704 (formatted dates only)
            f'<time datetime="{at.isoformat()}" title="{at:%Y-%m-%d %H:%M:%S} UTC">{at:%H:%M:%S}</time>'
        )


_IMG_WITHOUT_ALT = re.compile(r"<img(?![^>]*\balt=)")


def agent_markdown(text: str) -> Markup:
    """The agent's markdown, sanitised; an image it gave no text gets an empty one (decorative),
    so a screen reader does not read out its address. Cached by text when short: the page is
    rendered again on every visit and live reload, and a message's text never changes."""
    if len(text) <= MARKDOWN_CACHE_CHARS:
        return _cached_markdown(text)
    return _agent_markdown(text)


@functools.lru_cache(maxsize=MARKDOWN_CACHE_SIZE)
def _cached_markdown(text: str) -> Markup:
    return _agent_markdown(text)


def _agent_markdown(text: str) -> Markup:
    html = str(markdown(text, remote_images=False))
    return Markup(_IMG_WITHOUT_ALT.sub('<img alt=""', html))  # noqa: S704 (sanitised above; only an attribute added)


def _scalar(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


def _empty(value: Any) -> bool:
    """A field with nothing to say (null, an empty string, list or object): not shown."""
    return value is None or (isinstance(value, str | list | dict) and not value)


def _model_call(p: dict[str, Any], base: dict[str, Any]) -> Item:
    """One call through the model gateway: a line (model, tokens, time, cost, a failure), the
    fields with something to say on demand."""

    def num(key: str) -> int:
        v = p.get(key)
        return v if isinstance(v, int) and not isinstance(v, bool) else 0

    parts = [str(p.get("model") or "model")]
    parts.append(f"{num('input_tokens'):,} in / {num('output_tokens'):,} out")
    if num("latency_ms"):
        parts.append(duration(num("latency_ms")))
    cost = p.get("cost_usd")
    if isinstance(cost, int | float) and not isinstance(cost, bool):
        parts.append(f"${cost:,.4f}")
    status = num("status")
    failed = status >= 400 or bool(p.get("error"))
    if failed:
        parts.append(f"HTTP {status}" if status else "failed")
        if p.get("error"):
            parts.append(one_line(str(p["error"])))
    facts = [(k, _scalar(v)) for k, v in p.items() if not _empty(v) and not isinstance(v, dict | list)]
    return Item(kind="model", text=" · ".join(parts), label="error" if failed else "", facts=facts, **base)


def _phase(p: dict[str, Any]) -> Phase:
    detail = p.get("detail") or {}
    files = detail.get("changed_files") if isinstance(detail, dict) else None
    duration = p.get("duration_ms")
    text = str(p.get("text", ""))
    container = detail.get("container") if isinstance(detail, dict) else None
    if isinstance(container, str) and container:
        text = text.replace(container, short_name(container))
    return Phase(
        name=str(p.get("phase", "")),
        text=text,
        duration_ms=duration if isinstance(duration, int) else None,
        files=[str(f) for f in files] if isinstance(files, list) else [],
        container=container if isinstance(container, str) else "",
        log=str(detail.get("log") or "") if isinstance(detail, dict) else "",
    )


SHORT_NAME = 40


def short_name(name: str) -> str:
    """A long generated name (a pooled sandbox's is about 170 characters) as its head and tail."""
    return name if len(name) <= SHORT_NAME else f"{name[:24]}…{name[-10:]}"


def _policy(e: EventRead, p: dict[str, Any]) -> Item:
    d = p.get("detail") or {}
    endpoints = [
        Endpoint(
            url=str(x.get("url", "")),
            result=str(x.get("result", "")),
            decision=str(x.get("decision") or ""),
            status=x.get("status") if isinstance(x.get("status"), int) else None,
            latency_ms=x.get("latency_ms") if isinstance(x.get("latency_ms"), int | float) else None,
        )
        for x in d.get("endpoints", [])
        if isinstance(x, dict)
    ]
    return Item(
        kind="policy",
        seq=e.seq,
        run=e.run,
        at=e.at,
        text=str(p.get("text", "")),
        event=str(d.get("event", "")),
        decision=str(d.get("decision", "")),
        reason=str(d.get("reason") or ""),
        endpoints=endpoints,
        tool_id=str(d.get("tool_use_id") or ""),
    )


TOOL_RUN_STATES = frozenset(s.value for s in ToolRunState)


def _tool_run(p: dict[str, Any], base: dict[str, Any]) -> Item:
    """A custom tool's run changed state: one line (its text and state), the exit code and the
    failure on the line, the output tail folded. The state is one of the run's or `unknown`; a
    person decides a waiting run on its card (read from the run), never from this line."""
    state = str(p.get("state") or "")
    version = p.get("version")
    facts = [("version", str(version))] if isinstance(version, int) and not isinstance(version, bool) else []
    for key in ("exit_code", "failure_reason"):
        if not _empty(p.get(key)) and not isinstance(p.get(key), dict | list):
            facts.append((key, _scalar(p[key])))
    run_id = p.get("tool_run_id")
    tail = p.get("output_tail")
    return Item(
        kind="tool_run",
        text=str(p.get("text", "")),
        label=state if state in TOOL_RUN_STATES else "unknown",
        name=f"custom_{p.get('tool', '')}",
        facts=facts,
        tool_run_id=run_id if isinstance(run_id, int) and not isinstance(run_id, bool) else 0,
        tail=Text(tail) if isinstance(tail, str) and tail else None,
        **base,
    )


def item_of(e: EventRead) -> Item:
    """One stored event as its item (before the timeline merges it into another)."""
    p = e.payload
    base: dict[str, Any] = {"seq": e.seq, "run": e.run, "at": e.at}
    if e.kind == "prompt":
        who = f" by {p['author']}" if p.get("author") else ""
        # Verbatim: exactly what the agent was handed.
        return Item(kind="prompt", text=str(p.get("text", "")), label=f"{p.get('source', 'start')}{who}", **base)
    if e.kind in ("assistant", "summary"):
        return Item(kind=e.kind, html=agent_markdown(str(p.get("text", ""))), **base)
    if e.kind == "tool_call":
        fields, hint = tool_fields(p.get("input"))
        return Item(
            kind="tool", tool_id=str(p.get("id", "")), name=str(p.get("name", "")), fields=fields, hint=hint, **base
        )
    if e.kind == "tool_result":
        return Item(
            kind="result",
            tool_id=str(p.get("id", "")),
            name=str(p.get("name", "")),
            result=result_view(e.seq, p),
            **base,
        )
    if e.kind in ("stdout", "stderr"):
        text = str(p.get("text", ""))
        if p.get("omitted_bytes"):
            text += f"\n[... {plural(int(p['omitted_bytes']), 'byte')} of output not kept ...]\n"
        return Item(kind="output", label=e.kind, chunks=[(e.seq, text)], **base)
    if e.kind == "notice":
        return Item(kind="notice", text=str(p.get("text", "")), label=str(p.get("level", "info")), **base)
    if e.kind == "question":
        text = str(p.get("text", ""))
        options = [str(o) for o in p.get("options") or [] if isinstance(o, str | int | float)]
        pause = Pause("question", "question for you", True, question=text, options=options)
        return Item(kind="question", text=text, tool_id=str(p.get("tool_call_id") or ""), pause=pause, **base)
    if e.kind == "system":
        if p.get("phase") == "policy":
            return _policy(e, p)
        return Item(kind="phases", phases=[_phase(p)], **base)
    if e.kind == "model_call":
        return _model_call(p, base)
    if e.kind == "tool_run":
        return _tool_run(p, base)
    shown = {k: v for k, v in p.items() if not _empty(v)}
    facts = [(k, _scalar(v)) for k, v in shown.items() if k != "text" and not isinstance(v, dict | list)]
    nested = {k: v for k, v in shown.items() if isinstance(v, dict | list)}
    return Item(
        kind="generic",
        label=e.kind,
        text=str(p.get("text", "")),
        facts=facts,
        fields=[Field(k, Text(json_text(v)), is_json=True) for k, v in nested.items()],
        **base,
    )


def duration(ms: int | None) -> str:
    """How long a phase took, for a person: `850 ms`, `2.4 s`, `3 min 5 s`."""
    if ms is None:
        return ""
    if ms < 1000:
        return f"{ms} ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f} s"
    return f"{ms // 60_000} min {ms % 60_000 // 1000} s"
