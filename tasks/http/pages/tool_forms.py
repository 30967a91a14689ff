"""The custom tool pages' forms and what they show (tasks/http/pages/tools.py): a tool's form as
typed and as the REST body would say it (`ToolCreate`, `ToolUpdate`), where a refusal goes on the
form, the live check of a parameter schema, a test run's inputs, and the diff between two
versions (the script and the parameters as unified diffs, the other fields as before/after).
Pure and synchronous: no database, no I/O."""

import difflib
import json
from dataclasses import dataclass, field
from typing import Any

import msgspec

from forge.core.errors import ForgeError, InvalidInput
from forge.http.pages.common import WebForm
from forge.http.pages.forms import FormErrors, form_errors
from tasks.core import tool_schema
from tasks.core.custom_tool_schemas import (
    TIMEOUT_DEFAULT,
    TIMEOUT_MAX,
    TIMEOUT_MIN,
    ToolCreate,
    ToolUpdate,
    ToolVersionRead,
)
from tasks.http.pages.tool_cards import DiffLine, Text

NO_PARAMETERS = '{\n  "type": "object",\n  "properties": {},\n  "required": []\n}'
# What a refusal can name (its code) -> the form's input; a definition refusal names its field
# first (`script: ...`, `timeout_seconds: ...`), which places it too (`errors_of`).
ALIASES = {
    "invalid_tool_name": "name",
    "conflict": "name",
    "invalid_tool_schema": "parameters",
    "invalid_tool_mode": "mode",
}
OUTPUT_TAIL_CHARS = 4000
DIFF_CONTEXT = 3


class ToolForm(WebForm):
    """A tool's definition as the form posts it (checkbox: "1" or absent; numbers as typed)."""

    name: str = ""  # a new tool's only: a tool keeps its name
    description: str = ""
    parameters: str = NO_PARAMETERS
    script: str = ""
    interpreter: str = "sh"
    mode: str = "approval"
    read_only: str = ""
    timeout_seconds: str = str(TIMEOUT_DEFAULT)


INPUTS = tuple(f for f in ToolForm.__struct_fields__ if f != "csrf_token")


class TestRunForm(WebForm):
    inputs: str = "{}"
    version: str = ""  # blank: the active version, else the latest


class VersionForm(WebForm):
    version: str = ""


class EnableForm(WebForm):
    enabled: str = ""  # "1": switch on; blank: switch off


class SchemaCheckForm(WebForm):
    parameters: str = ""


class SchemaCheck(msgspec.Struct, kw_only=True):
    """The live check's answer: whether the parameter schema is valid, and what to tell the person."""

    ok: bool
    message: str


def form_of(v: ToolVersionRead) -> ToolForm:
    """A version's definition as the edit form shows it (the next version starts from it)."""
    return ToolForm(
        description=v.description,
        parameters=json.dumps(v.parameters, indent=2, ensure_ascii=False),
        script=v.script,
        interpreter=v.interpreter,
        mode=v.mode,
        read_only="1" if v.read_only else "",
        timeout_seconds=str(v.timeout_seconds),
    )


def _parameters(text: str) -> dict[str, Any]:
    """The schema as typed, strictly decoded (a key twice is refused) and checked; blank: none."""
    if not text.strip():
        return {"type": "object", "properties": {}, "required": []}
    try:
        return tool_schema.parse_schema(text)
    except tool_schema.ToolSchemaError as exc:
        raise InvalidInput(exc.message, code=exc.code, field="parameters") from None


def _timeout(text: str) -> int:
    raw = text.strip()
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 6:
        raise InvalidInput(
            f"timeout_seconds: a whole number of seconds from {TIMEOUT_MIN} to {TIMEOUT_MAX}",
            code="invalid_tool_definition",
            field="timeout_seconds",
        )
    return int(raw)


def definition_of(form: ToolForm) -> dict[str, Any]:
    """The form's definition fields as the REST body says them (the service checks the rest)."""
    return {
        "description": form.description.replace("\r\n", "\n").strip(),
        "parameters": _parameters(form.parameters),
        "script": form.script.replace("\r\n", "\n"),
        "interpreter": form.interpreter,
        "mode": form.mode,
        "read_only": bool(form.read_only),
        "timeout_seconds": _timeout(form.timeout_seconds),
    }


def tool_create(form: ToolForm) -> ToolCreate:
    return ToolCreate(name=form.name.strip(), **definition_of(form))


def tool_update(form: ToolForm) -> ToolUpdate:
    return ToolUpdate(**definition_of(form))


DEFINITION_FIELDS = ("description", "parameters", "script", "interpreter", "mode", "read_only", "timeout_seconds")


def unchanged(change: ToolUpdate, latest: ToolVersionRead) -> bool:
    """Whether a change says what the latest version says already (no new version for it)."""
    return all(getattr(change, name) == getattr(latest, name) for name in DEFINITION_FIELDS)


def errors_of(exc: ForgeError) -> FormErrors:
    """A refusal beside the input it concerns: its field or code, else the field its message
    starts with (`script: ...`); otherwise the form's general error."""
    found = form_errors(exc, INPUTS, ALIASES)
    if found.fields:
        return found
    head = exc.detail.partition(":")[0].strip()
    return FormErrors(fields={head: exc.detail}) if head in INPUTS else found


def check_schema(text: str) -> SchemaCheck:
    """The live check of a parameter schema as typed (the same rules as saving it)."""
    if not text.strip():
        return SchemaCheck(ok=True, message="No parameters: the tool takes no inputs.")
    try:
        schema = tool_schema.parse_schema(text)
    except tool_schema.ToolSchemaError as exc:
        return SchemaCheck(ok=False, message=exc.message)
    names = list(schema["properties"])
    if not names:
        return SchemaCheck(ok=True, message="Valid: the tool takes no inputs.")
    required = len(schema["required"])
    listed = ", ".join(names)
    count = f"{len(names)} parameter{'s' if len(names) != 1 else ''}"
    return SchemaCheck(ok=True, message=f"Valid: {count} ({listed}), {required} required.")


def run_inputs(text: str) -> dict[str, Any]:
    """A test run's inputs as typed: a JSON object (the tool's schema checks its fields)."""
    if not text.strip():
        return {}
    try:
        value = tool_schema.loads_strict(text)
    except ValueError as exc:
        raise InvalidInput(f"inputs: not valid JSON: {exc}", code="invalid_tool_inputs", field="inputs") from None
    if not isinstance(value, dict):
        raise InvalidInput("inputs: must be a JSON object", code="invalid_tool_inputs", field="inputs")
    return value


def version_number(text: str) -> int | None:
    """A version select's value: a number, or None (blank or not a number)."""
    raw = text.strip()
    return int(raw) if raw.isascii() and raw.isdigit() and len(raw) < 9 else None


def inputs_skeleton(parameters: dict[str, Any]) -> str:
    """A test run's starting inputs: each parameter with a value of its kind."""
    blank = {"string": "", "number": 0, "integer": 0, "boolean": False}
    values: dict[str, Any] = {}
    for name, spec in parameters.get("properties", {}).items():
        kind = spec.get("type") if isinstance(spec, dict) else None
        enum = spec.get("enum") if isinstance(spec, dict) else None
        values[name] = enum[0] if isinstance(enum, list) and enum else blank.get(str(kind), "")
    return json.dumps(values, indent=2, ensure_ascii=False)


def output_tail(output: str) -> Text:
    """A run's output as the history shows it: its last part when long."""
    if len(output) <= OUTPUT_TAIL_CHARS:
        return Text(output)
    return Text("[...]\n" + output[-OUTPUT_TAIL_CHARS:])


# --- the diff between two versions ------------------------------------------------------------


@dataclass
class FieldChange:
    name: str
    old: str
    new: str


@dataclass
class VersionDiff:
    old: int
    new: int
    script: list[DiffLine] = field(default_factory=list)
    parameters: list[DiffLine] = field(default_factory=list)
    changes: list[FieldChange] = field(default_factory=list)

    @property
    def same(self) -> bool:
        return not (self.script or self.parameters or self.changes)


def unified(old: str, new: str, old_name: str, new_name: str) -> list[DiffLine]:
    """A unified diff (difflib) as lines: `+`, `-`, ` ` or `@` (a hunk's or a file's header)."""
    out: list[DiffLine] = []
    lines = difflib.unified_diff(
        old.splitlines(), new.splitlines(), fromfile=old_name, tofile=new_name, lineterm="", n=DIFF_CONTEXT
    )
    for line in lines:
        if line.startswith(("---", "+++", "@@")):
            out.append(DiffLine("@", line))
        else:
            out.append(DiffLine(line[:1] or " ", line[1:]))
    return out


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def version_diff(old: ToolVersionRead, new: ToolVersionRead) -> VersionDiff:
    a, b = f"version {old.version}", f"version {new.version}"
    before, after = (json.dumps(v.parameters, indent=2, ensure_ascii=False, sort_keys=True) for v in (old, new))
    diff = VersionDiff(
        old=old.version,
        new=new.version,
        script=unified(old.script, new.script, f"script ({a})", f"script ({b})"),
        parameters=unified(before, after, f"parameters ({a})", f"parameters ({b})"),
    )
    for name in ("description", "interpreter", "mode", "read_only", "timeout_seconds"):
        was, now = getattr(old, name), getattr(new, name)
        if was != now:
            diff.changes.append(FieldChange(name.replace("_", " "), _shown(was), _shown(now)))
    return diff


def choose_diff(versions: list[ToolVersionRead], old: int | None, new: int | None) -> VersionDiff | None:
    """The versions to compare: those asked for, else the latest and the one before it."""
    by_number = {v.version: v for v in versions}
    if len(versions) < 2 and (old is None or new is None):
        return None
    newer = by_number.get(new or 0) or versions[-1]
    older = by_number.get(old or 0) or by_number.get(newer.version - 1) or versions[0]
    return version_diff(older, newer)
