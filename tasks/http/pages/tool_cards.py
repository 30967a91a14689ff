"""A tool call's card on the task page: its input as the agent wrote it (a command as the command,
written content as content, an edit as a small diff) and its result with its outcome (an exit
status, ok or error; held for a person is not a failure). Pure and synchronous."""

import difflib
import json
import re
from dataclasses import dataclass
from typing import Any

from tasks.http.pages.pauses import held

# Longer outputs and inputs are folded ("show all"), in their own scrolling box until then.
FOLD_LINES = 24
FOLD_CHARS = 3000
SUMMARY_CHARS = 90
DIFF_CONTEXT = 2
# Keys whose value names the file a tool works on (builtin: path; Claude Code: file_path).
PATH_KEYS = ("path", "file_path", "notebook_path")


@dataclass
class Text:
    """A piece of text shown verbatim, folded when long."""

    text: str
    lines: int = 0
    long: bool = False

    def __post_init__(self) -> None:
        self.lines = self.text.count("\n") + (0 if self.text.endswith("\n") or not self.text else 1)
        self.long = self.lines > FOLD_LINES or len(self.text) > FOLD_CHARS


@dataclass
class DiffLine:
    origin: str  # "+", "-", " ", or "@" for a hunk header
    text: str


@dataclass
class Field:
    """One argument of a tool call: a string as written, a diff, or other JSON pretty-printed."""

    label: str
    text: Text | None = None
    diff: list[DiffLine] | None = None
    is_json: bool = False


@dataclass
class ToolResultView:
    seq: int
    output: Text
    status: str  # "exit code 0", "timed out", "" (not a shell command)
    is_error: bool
    omitted_bytes: int
    stdout: Text | None = None
    stderr: Text | None = None
    # What the agent was told when its call was held for a person (`HELD_MARKERS`), or about a
    # call a person denied: shown as such, not as an error.
    held: bool = False

    @property
    def outcome(self) -> str:
        """How the call went, in a word or two: its exit status, else `error` or `ok`."""
        return self.status or ("error" if self.is_error else "ok")

    @property
    def tone(self) -> str:
        """The outcome's badge class: ok, warn (a non-zero exit, a timeout) or error."""
        if self.is_error:
            return "error"
        return "ok" if self.outcome in ("ok", "exit code 0") else "warn"


def json_text(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False)


def one_line(text: str) -> str:
    first = text.strip().splitlines()[0] if text.strip() else ""
    return first if len(first) <= SUMMARY_CHARS else first[: SUMMARY_CHARS - 1] + "…"


def edit_diff(old: str, new: str) -> list[DiffLine]:
    out: list[DiffLine] = []
    for line in difflib.unified_diff(old.splitlines(), new.splitlines(), lineterm="", n=DIFF_CONTEXT):
        if line.startswith(("---", "+++")):
            continue
        if line.startswith("@@"):
            out.append(DiffLine("@", line))
        else:
            out.append(DiffLine(line[:1] or " ", line[1:]))
    return out


def tool_fields(value: Any) -> tuple[list[Field], str]:
    """The call's arguments as fields, and a one-line hint for its card's summary."""
    if not isinstance(value, dict):
        text = value if isinstance(value, str) else json_text(value)
        return [Field("input", Text(text), is_json=not isinstance(value, str))], one_line(text)
    fields: list[Field] = []
    hint = ""
    rest = dict(value)
    path = next((str(rest[k]) for k in PATH_KEYS if isinstance(rest.get(k), str)), "")
    old, new = rest.get("old_string"), rest.get("new_string")
    if isinstance(old, str) and isinstance(new, str):
        del rest["old_string"], rest["new_string"]
        fields.append(Field(f"change to {path}" if path else "change", diff=edit_diff(old, new)))
    for key, val in rest.items():
        if isinstance(val, str):
            fields.append(Field(key, Text(val)))
        else:
            fields.append(Field(key, Text(json_text(val)), is_json=True))
    command = rest.get("command")
    if isinstance(command, str):
        hint = one_line(command)
    elif path:
        hint = path
    else:
        hint = next((one_line(v) for v in rest.values() if isinstance(v, str) and v.strip()), "")
    if fields and fields[0].diff is None:
        # The main argument first: what a reader looks for (the command, the file).
        fields.sort(key=lambda f: f.label not in ("command", *PATH_KEYS))
    return fields, hint


_EXIT = re.compile(r"[Ee]xit code -?\d{1,3}")


def result_view(seq: int, p: dict[str, Any]) -> ToolResultView:
    output = str(p.get("output", ""))
    status = ""
    head = output.partition("\n")[0].strip()
    # The builtin shell tool's first line (`exit code 2`, `timed out`), Claude Code's Bash error's
    # (`Exit code 2`): shown as the call's outcome; the output stays as the agent saw it.
    if _EXIT.fullmatch(head) or head == "timed out":
        status = head.lower()
    stdout, stderr = p.get("stdout"), p.get("stderr")
    return ToolResultView(
        seq=seq,
        output=Text(output),
        status=status,
        is_error=bool(p.get("is_error")),
        omitted_bytes=int(p.get("omitted_bytes") or 0),
        stdout=Text(stdout) if isinstance(stdout, str) and stdout else None,
        stderr=Text(stderr) if isinstance(stderr, str) and stderr else None,
        held=held(output),
    )
