"""Custom tools' names, parameter schemas and inputs: the flat JSON Schema subset a custom tool may
declare (string, number, integer and boolean parameters with bounds), the checks an agent's
arguments pass before the tool's script runs, their hash (what an approval is bound to) and the
environment variables they reach the script through. Pure: no database, no I/O.

Every refusal is a `ToolSchemaError` with a stable `code` and a message that names the field
(`parameters.properties.count: ...`, `inputs.count: ...`) and says how to fix it."""

import json
import math
import re
from typing import Any

from tasks.core.policy import input_hash
from tasks.core.strict_json import loads_strict as loads_strict

NAME_PATTERN = r"^[a-z][a-z0-9_]{0,47}$"
SCHEMA_MAX_BYTES = 16 * 1024
INPUTS_MAX_BYTES = 16 * 1024
STRING_MAX = 8192
PROPERTIES_MAX = 20
DESCRIPTION_MAX = 1000
ENUM_MAX = 100
ENV_PREFIX = "FORGEHAND_ARG_"

# Listed literally: tasks.core may not import tasks.run (a unit test checks these stay complete).
_BACKCHANNEL_TOOLS = (
    "ask_user",
    "report_summary",
    "record_progress",
    "spawn_subtask",
    "submit_review",
    "get_tool_run",
    "propose_tool",
)
_BUILTIN_RUNTIME_TOOLS = ("bash", "read_file", "write_file", "edit_file", "list_files")
# Claude Code's and Codex's tools (tasks.run.runtimes.tool_kinds), lowercased ...
_CLI_TOOLS = (
    *("bash", "bashoutput", "killshell", "killbash", "monitor", "edit", "multiedit", "write"),
    *("notebookedit", "read", "notebookread", "glob", "grep", "ls", "toolsearch", "webfetch"),
    *("websearch", "task", "agent", "todowrite", "sendmessage", "exitplanmode", "enterplanmode"),
    *("exec_command", "write_stdin", "apply_patch", "view_image", "web_search", "update_plan"),
)
# ... and in snake_case, which a model would read as the same tool.
_CLI_TOOLS_SNAKE = (
    *("bash_output", "kill_shell", "kill_bash", "multi_edit", "notebook_edit", "notebook_read"),
    *("tool_search", "web_fetch", "todo_write", "send_message", "exit_plan_mode", "enter_plan_mode"),
)
RESERVED_TOOL_NAMES: frozenset[str] = frozenset(
    (*_BACKCHANNEL_TOOLS, *_BUILTIN_RUNTIME_TOOLS, *_CLI_TOOLS, *_CLI_TOOLS_SNAKE)
)
CUSTOM_PREFIX = "custom_"
MCP_PREFIX = "mcp__"

_NAME_RE = re.compile(NAME_PATTERN)
_NAME_RULE = "a lowercase letter, then up to 47 lowercase letters, digits or underscores"
_TOP_KEYS = ("type", "properties", "required", "additionalProperties", "description")
_KINDS = ("string", "number", "integer", "boolean")
_KIND_KEYWORDS: dict[str, tuple[str, ...]] = {
    "string": ("minLength", "maxLength", "enum"),
    "number": ("minimum", "maximum"),
    "integer": ("minimum", "maximum"),
    "boolean": (),
}
_A_KIND = {"string": "a string", "number": "a number", "integer": "an integer", "boolean": "a boolean"}


class ToolSchemaError(Exception):
    """A custom tool's name, schema or inputs refused: `code` is one of `invalid_tool_name`,
    `invalid_tool_schema`, `invalid_tool_inputs`; `message` names the field and the fix."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _schema_error(where: str, text: str) -> ToolSchemaError:
    return ToolSchemaError("invalid_tool_schema", f"{where}: {text}")


def _inputs_error(where: str, text: str) -> ToolSchemaError:
    return ToolSchemaError("invalid_tool_inputs", f"{where}: {text}")


# --- sizes and decoding ------------------------------------------------------------------------


def _decode(raw: bytes | str, limit: int, code: str, root: str) -> Any:
    """JSON text -> value, refusing text over `limit` bytes as UTF-8 and anything not strict JSON."""
    if not isinstance(raw, bytes | bytearray | str):
        raise ToolSchemaError(code, f"{root}: must be JSON text (got {type(raw).__name__})")
    try:
        size = len(raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw)
        if size > limit:
            raise ToolSchemaError(code, f"{root}: must be at most {limit} bytes of JSON (got {size})")
        return loads_strict(raw)
    except ValueError as exc:
        raise ToolSchemaError(code, f"{root}: not valid JSON: {exc}") from None


def _check_size(value: object, limit: int, code: str, root: str) -> None:
    """A decoded value's size as compact UTF-8 JSON text, at most `limit` bytes."""
    try:
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=repr)
    except (TypeError, ValueError, RecursionError) as exc:
        raise ToolSchemaError(code, f"{root}: must be JSON data ({exc})") from None
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > limit:
        raise ToolSchemaError(code, f"{root}: must be at most {limit} bytes of JSON (got {size})")


# --- describing values in messages -------------------------------------------------------------


def _got(value: object) -> str:
    """What a value is, for `(got ...)`: a kind for text and containers, the value for numbers."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    kinds = {str: "a string", list: "a list", dict: "an object", type(None): "null"}
    return kinds.get(type(value), f"a {type(value).__name__}")


def _show(text: object, limit: int = 60) -> str:
    shown = repr(text)
    return shown if len(shown) <= limit else shown[: limit - 4] + "...'"


def _text_problem(text: str) -> str | None:
    """Why a string cannot reach a script's environment, if it cannot."""
    if "\x00" in text:
        return "must not contain a NUL character"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "must be valid Unicode text (it has a lone surrogate)"
    return None


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return _is_int(value) or (isinstance(value, float) and math.isfinite(value))


# --- tool names --------------------------------------------------------------------------------


def _is_reserved(name: str) -> bool:
    return (
        name in RESERVED_TOOL_NAMES
        or name.removeprefix(CUSTOM_PREFIX) in RESERVED_TOOL_NAMES
        or CUSTOM_PREFIX + name in RESERVED_TOOL_NAMES
    )


def check_name(name: object) -> str:
    """A custom tool's name: snake_case, 1-48 characters, never a builtin tool's name (with or
    without `custom_`), never an MCP-style `mcp__` name."""
    if not isinstance(name, str):
        raise ToolSchemaError("invalid_tool_name", f"name: must be a string (got {_got(name)})")
    if not _NAME_RE.fullmatch(name):
        raise ToolSchemaError("invalid_tool_name", f"name: {_show(name)} must be snake_case: {_NAME_RULE}")
    if name.startswith(MCP_PREFIX):
        raise ToolSchemaError("invalid_tool_name", f"name: {name!r} must not start with {MCP_PREFIX!r}")
    if _is_reserved(name):
        raise ToolSchemaError(
            "invalid_tool_name",
            f"name: {name!r} is a builtin tool's name (with or without {CUSTOM_PREFIX!r}); choose another name",
        )
    return name


# --- parameter schemas -------------------------------------------------------------------------


def parse_schema(raw: bytes | str) -> dict[str, Any]:
    """A parameter schema as JSON text -> the validated, normalised schema."""
    return _validate_schema(_decode(raw, SCHEMA_MAX_BYTES, "invalid_tool_schema", "parameters"))


def check_schema(schema: object) -> dict[str, Any]:
    """An already-decoded parameter schema -> the validated, normalised schema: always
    `additionalProperties: false`, a `required` list and an explicit maxLength on free strings."""
    _check_size(schema, SCHEMA_MAX_BYTES, "invalid_tool_schema", "parameters")
    return _validate_schema(schema)


def _validate_schema(schema: object) -> dict[str, Any]:
    if not isinstance(schema, dict):
        raise _schema_error("parameters", f"must be a JSON object (got {_got(schema)})")
    for key in schema:
        if key not in _TOP_KEYS:
            raise _schema_error("parameters", f"unknown keyword {_show(key)} (allowed: {', '.join(_TOP_KEYS)})")
    _check_top_type(schema)
    properties = _check_properties(schema)
    required = _check_required(schema.get("required", []), properties)
    if "additionalProperties" in schema and schema["additionalProperties"] is not False:
        raise _schema_error("parameters", "additionalProperties must be false (inputs never take other keys)")
    out: dict[str, Any] = {"type": "object", "properties": properties, "required": required}
    out["additionalProperties"] = False
    if "description" in schema:
        out["description"] = _check_description(schema["description"], "parameters")
    return out


def _check_top_type(schema: dict[Any, Any]) -> None:
    if "type" not in schema:
        raise _schema_error("parameters", 'type is required and must be "object"')
    if schema["type"] != "object":
        raise _schema_error("parameters", f'type must be "object" (got {_show(schema["type"])})')


def _check_description(value: object, where: str) -> str:
    if not isinstance(value, str):
        raise _schema_error(where, f"description must be a string (got {_got(value)})")
    if len(value) > DESCRIPTION_MAX:
        raise _schema_error(where, f"description must be at most {DESCRIPTION_MAX} characters (got {len(value)})")
    problem = _text_problem(value)
    if problem:
        raise _schema_error(where, f"description {problem}")
    return value


def _check_properties(schema: dict[Any, Any]) -> dict[str, Any]:
    if "properties" not in schema:
        raise _schema_error("parameters", "properties is required (an object, {} for a tool without parameters)")
    properties = schema["properties"]
    if not isinstance(properties, dict):
        raise _schema_error("parameters.properties", f"must be an object of parameters (got {_got(properties)})")
    if len(properties) > PROPERTIES_MAX:
        raise _schema_error(
            "parameters.properties", f"at most {PROPERTIES_MAX} parameters are allowed (got {len(properties)})"
        )
    return {_check_param_name(name): _check_property(name, spec) for name, spec in properties.items()}


def _check_param_name(name: object) -> str:
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise _schema_error(
            "parameters.properties",
            f"parameter name {_show(name)} must be {_NAME_RULE} (it becomes {ENV_PREFIX}<NAME>)",
        )
    return name


def _check_required(value: object, properties: dict[str, Any]) -> list[str]:
    if not isinstance(value, list):
        raise _schema_error("parameters", f"required must be a list of parameter names (got {_got(value)})")
    for name in value:
        if not isinstance(name, str):
            raise _schema_error("parameters", f"required must list parameter names as strings (got {_got(name)})")
        if name not in properties:
            raise _schema_error("parameters", f"required lists {_show(name)}, which is not one of the properties")
    if len(set(value)) != len(value):
        twice = next(name for name in value if value.count(name) > 1)
        raise _schema_error("parameters", f"required lists {_show(twice)} more than once")
    return list(value)


def _check_property(name: str, spec: object) -> dict[str, Any]:
    where = f"parameters.properties.{name}"
    if not isinstance(spec, dict):
        raise _schema_error(where, f"must be an object with a type (got {_got(spec)})")
    kind = _check_kind(spec, where)
    allowed = ("type", "description", *_KIND_KEYWORDS[kind])
    for key in spec:
        if key not in allowed:
            raise _schema_error(
                where, f"unknown keyword {_show(key)} for {_A_KIND[kind]} parameter (allowed: {', '.join(allowed)})"
            )
    out: dict[str, Any] = {"type": kind}
    if "description" in spec:
        out["description"] = _check_description(spec["description"], where)
    if kind == "string":
        out.update(_check_string_spec(spec, where))
    elif kind in ("number", "integer"):
        out.update(_check_bounds(spec, where, kind))
    return out


def _check_kind(spec: dict[Any, Any], where: str) -> str:
    if "type" not in spec:
        raise _schema_error(where, f"type is required (one of {', '.join(_KINDS)})")
    kind = spec["type"]
    if kind in ("object", "array"):
        raise _schema_error(where, f"type {kind!r} is not allowed: no nesting, use one of {', '.join(_KINDS)}")
    if not isinstance(kind, str) or kind not in _KINDS:
        raise _schema_error(where, f"type must be one of {', '.join(_KINDS)} (got {_show(kind)})")
    return kind


def _check_string_spec(spec: dict[Any, Any], where: str) -> dict[str, Any]:
    if "enum" in spec:
        if "minLength" in spec or "maxLength" in spec:
            raise _schema_error(where, "enum cannot be combined with minLength or maxLength")
        return {"enum": _check_enum(spec["enum"], where)}
    low = _check_length(spec, "minLength", 0, where)
    high = _check_length(spec, "maxLength", STRING_MAX, where)
    if low > high:
        raise _schema_error(where, f"minLength ({low}) must not be greater than maxLength ({high})")
    return {"minLength": low, "maxLength": high} if "minLength" in spec else {"maxLength": high}


def _check_length(spec: dict[Any, Any], key: str, default: int, where: str) -> int:
    value = spec.get(key, default)
    if not _is_int(value) or not 0 <= value <= STRING_MAX:
        raise _schema_error(where, f"{key} must be an integer from 0 to {STRING_MAX} (got {_got(value)})")
    return int(value)


def _check_enum(values: object, where: str) -> list[str]:
    if not isinstance(values, list):
        raise _schema_error(where, f"enum must be a list of strings (got {_got(values)})")
    if not values:
        raise _schema_error(where, "enum must list at least one string")
    if len(values) > ENUM_MAX:
        raise _schema_error(where, f"enum must list at most {ENUM_MAX} strings (got {len(values)})")
    for value in values:
        _check_enum_value(value, where)
    if len(set(values)) != len(values):
        twice = next(value for value in values if values.count(value) > 1)
        raise _schema_error(where, f"enum lists {_show(twice)} more than once")
    return list(values)


def _check_enum_value(value: object, where: str) -> None:
    if not isinstance(value, str):
        raise _schema_error(where, f"enum values must be strings (got {_got(value)})")
    if len(value) > STRING_MAX:
        raise _schema_error(where, f"enum values must be at most {STRING_MAX} characters (got {len(value)})")
    problem = _text_problem(value)
    if problem:
        raise _schema_error(where, f"enum value {_show(value)} {problem}")


def _check_bounds(spec: dict[Any, Any], where: str, kind: str) -> dict[str, Any]:
    low = _check_bound(spec, "minimum", where, kind)
    high = _check_bound(spec, "maximum", where, kind)
    if low > high:
        raise _schema_error(where, f"minimum ({low!r}) must not be greater than maximum ({high!r})")
    return {"minimum": low, "maximum": high}


def _check_bound(spec: dict[Any, Any], key: str, where: str, kind: str) -> int | float:
    if key not in spec:
        raise _schema_error(where, f"{key} is required for {_A_KIND[kind]} parameter")
    value = spec[key]
    if kind == "integer" and not _is_int(value):
        raise _schema_error(where, f"{key} must be an integer (got {_got(value)})")
    if not _is_number(value):
        raise _schema_error(where, f"{key} must be a finite number (got {_got(value)})")
    return int(value) if kind == "integer" else value


# --- inputs ------------------------------------------------------------------------------------


def parse_inputs(raw: bytes | str, schema: dict[str, Any]) -> dict[str, Any]:
    """An agent's arguments as JSON text -> the validated inputs."""
    schema = check_schema(schema)
    return _validate_inputs(_decode(raw, INPUTS_MAX_BYTES, "invalid_tool_inputs", "inputs"), schema)


def check_inputs(inputs: object, schema: dict[str, Any]) -> dict[str, Any]:
    """Already-decoded arguments -> the validated inputs, in the schema's parameter order. The
    schema is checked (and normalised) first: a bad one is `invalid_tool_schema`."""
    schema = check_schema(schema)
    _check_size(inputs, INPUTS_MAX_BYTES, "invalid_tool_inputs", "inputs")
    return _validate_inputs(inputs, schema)


def _validate_inputs(inputs: object, schema: dict[str, Any]) -> dict[str, Any]:
    if not isinstance(inputs, dict):
        raise _inputs_error("inputs", f"must be a JSON object (got {_got(inputs)})")
    properties: dict[str, Any] = schema["properties"]
    for key in inputs:
        if key not in properties:
            takes = ", ".join(properties) or "no parameters"
            raise _inputs_error("inputs", f"unknown parameter {_show(key)} (this tool takes: {takes})")
    for name in schema["required"]:
        if name not in inputs:
            raise _inputs_error(f"inputs.{name}", "required parameter is missing")
    return {name: _check_value(name, inputs[name], spec) for name, spec in properties.items() if name in inputs}


def _check_value(name: str, value: object, spec: dict[str, Any]) -> Any:
    where = f"inputs.{name}"
    if spec["type"] == "string":
        return _check_string(where, value, spec)
    if spec["type"] == "boolean":
        if not isinstance(value, bool):
            raise _inputs_error(where, f"must be true or false (got {_got(value)})")
        return value
    return _check_number(where, value, spec)


def _check_string(where: str, value: object, spec: dict[str, Any]) -> str:
    if not isinstance(value, str):
        raise _inputs_error(where, f"must be a string (got {_got(value)})")
    problem = _text_problem(value)
    if problem:
        raise _inputs_error(where, problem)
    if "enum" in spec:
        if value not in spec["enum"]:
            raise _inputs_error(where, f"must be one of {_choices(spec['enum'])} (got {_show(value)})")
        return value
    low, high = spec.get("minLength", 0), spec["maxLength"]
    if not low <= len(value) <= high:
        raise _inputs_error(where, f"must be from {low} to {high} characters long (got {len(value)})")
    return value


def _choices(values: list[str], shown: int = 10) -> str:
    listed = ", ".join(_show(value) for value in values[:shown])
    return listed + (f" (and {len(values) - shown} more)" if len(values) > shown else "")


def _check_number(where: str, value: object, spec: dict[str, Any]) -> int | float:
    integer = spec["type"] == "integer"
    low, high = spec["minimum"], spec["maximum"]
    ok = _is_int(value) if integer else _is_number(value)
    if not ok or not isinstance(value, int | float) or not low <= value <= high:
        kind = "an integer" if integer else "a number"
        raise _inputs_error(where, f"must be {kind} from {low!r} to {high!r} (got {_got(value)})")
    return value


def inputs_hash(inputs: dict[str, Any]) -> str:
    """The hash an approval of a custom tool's run is bound to (`tasks.core.policy.input_hash`)."""
    return input_hash(inputs)


def env_for(inputs: dict[str, Any]) -> dict[str, str]:
    """The script's environment for validated inputs: `FORGEHAND_ARG_<NAME>` per given input;
    strings as they are, booleans `true`/`false`, numbers as their JSON text."""
    return {ENV_PREFIX + name.upper(): _env_text(value) for name, value in inputs.items()}


def _env_text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    return json.dumps(value)
