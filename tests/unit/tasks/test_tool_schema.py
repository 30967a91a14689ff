"""Custom tools' names, parameter schemas and inputs (tasks.core.tool_schema): every rule refused
with its own message, naming the field; strings reach the script untouched."""

import json
import math
import re
from collections.abc import Callable
from typing import Any

import pytest

from tasks.core.policy import input_hash
from tasks.core.tool_schema import (
    INPUTS_MAX_BYTES,
    NAME_PATTERN,
    PROPERTIES_MAX,
    RESERVED_TOOL_NAMES,
    SCHEMA_MAX_BYTES,
    STRING_MAX,
    ToolSchemaError,
    check_inputs,
    check_name,
    check_schema,
    env_for,
    inputs_hash,
    loads_strict,
    parse_inputs,
    parse_schema,
)


def refused(code: str, call: Callable[..., Any], *args: Any) -> str:
    """The message of the `ToolSchemaError` a call raises, after checking its code."""
    with pytest.raises(ToolSchemaError) as info:
        call(*args)
    assert info.value.code == code
    assert str(info.value) == info.value.message
    return info.value.message


def schema_with(**properties: Any) -> dict[str, Any]:
    return {"type": "object", "properties": properties}


COUNT = {"type": "integer", "minimum": 1, "maximum": 10}
SCHEMA = check_schema(
    {
        "type": "object",
        "description": "Deploy a branch.",
        "properties": {
            "branch": {"type": "string", "minLength": 1, "maxLength": 20, "description": "Which branch."},
            "env": {"type": "string", "enum": ["staging", "production"]},
            "count": COUNT,
            "ratio": {"type": "number", "minimum": -0.5, "maximum": 2.5},
            "dry_run": {"type": "boolean"},
            "note": {"type": "string"},
        },
        "required": ["branch", "count"],
    }
)
GOOD_INPUTS = {"branch": "main", "env": "staging", "count": 3, "ratio": 0.5, "dry_run": True, "note": "hi"}


# --- the error and the constants ---------------------------------------------------------------


def test_error_carries_code_and_message() -> None:
    error = ToolSchemaError("invalid_tool_name", "name: bad")
    assert (error.code, error.message, str(error)) == ("invalid_tool_name", "name: bad", "name: bad")
    assert isinstance(error, Exception)


def test_limits() -> None:
    assert (SCHEMA_MAX_BYTES, INPUTS_MAX_BYTES, STRING_MAX, PROPERTIES_MAX) == (16384, 16384, 8192, 20)
    assert NAME_PATTERN == r"^[a-z][a-z0-9_]{0,47}$"


# --- tool names --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["a", "deploy", "run_tests2", "a" * 48, "x_" * 24, "custom_deploy", "bash2"])
def test_good_names_pass(name: str) -> None:
    assert check_name(name) == name
    assert re.fullmatch(NAME_PATTERN, name)


@pytest.mark.parametrize("name", ["", "A", "Deploy", "1a", "_a", "a-b", "a b", "a.b", "é", "a" * 49, "abc\n", "ab\x00"])
def test_names_not_snake_case_refused(name: str) -> None:
    message = refused("invalid_tool_name", check_name, name)
    assert message.startswith("name: ")
    assert repr(name) in message
    assert "snake_case" in message


@pytest.mark.parametrize("name", [None, 5, True, b"deploy", ["deploy"]])
def test_names_not_strings_refused(name: object) -> None:
    message = refused("invalid_tool_name", check_name, name)
    assert message.startswith("name: must be a string")


@pytest.mark.parametrize(
    "name",
    [
        "bash",
        "custom_bash",
        "ask_user",
        "custom_ask_user",
        "get_tool_run",
        "propose_tool",
        "read_file",
        "custom_list_files",
        "exec_command",
        "apply_patch",
        "web_search",
        "websearch",
        "read",
        "edit",
        "write",
        "web_fetch",
        "todo_write",
    ],
)
def test_builtin_names_refused_with_or_without_prefix(name: str) -> None:
    message = refused("invalid_tool_name", check_name, name)
    assert message.startswith(f"name: {name!r}")
    assert "builtin" in message


def test_mcp_style_names_refused() -> None:
    message = refused("invalid_tool_name", check_name, "mcp__forgehand__deploy")
    assert message.startswith("name: 'mcp__forgehand__deploy'")
    assert "mcp__" in message


def test_reserved_names_cover_every_real_tool() -> None:
    from tasks.run.backchannel.tools import TOOL_NAMES as BACKCHANNEL
    from tasks.run.runtimes.builtin.model_client import TOOL_NAMES as BUILTIN
    from tasks.run.runtimes.tool_kinds import TOOL_KINDS

    real = {*BACKCHANNEL, *BUILTIN, *TOOL_KINDS, "get_tool_run", "propose_tool"}
    assert {"bash", "read_file", "write_file", "edit_file", "list_files"} <= set(BUILTIN)
    missing = {name.lower() for name in real} - RESERVED_TOOL_NAMES
    assert not missing
    for name in real:
        with pytest.raises(ToolSchemaError):
            check_name(name.lower())


# --- strict JSON -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ('{"a": 1, "a": 2}', "'a'"),
        ('{"x": {"type": "string", "type": "integer"}}', "'type'"),
        ('[{"ok": 1}, {"deep": 1, "deep": 2}]', "'deep'"),
    ],
)
def test_loads_strict_refuses_duplicate_keys(text: str, key: str) -> None:
    with pytest.raises(ValueError, match="duplicate key") as info:
        loads_strict(text)
    assert key in str(info.value)


@pytest.mark.parametrize("text", ["NaN", "[Infinity]", '{"a": -Infinity}', "1e400", "[-1e999]"])
def test_loads_strict_refuses_non_finite_numbers(text: str) -> None:
    with pytest.raises(ValueError, match="finite"):
        loads_strict(text)


@pytest.mark.parametrize("raw", [b'"\xff"', b'{"a": "\xc3"}', b"\xed\xa0\x80", "\ud800"])
def test_loads_strict_refuses_invalid_utf8(raw: bytes | str) -> None:
    with pytest.raises(ValueError, match="UTF-8"):
        loads_strict(raw)


def test_loads_strict_refuses_deep_nesting_and_huge_integers() -> None:
    with pytest.raises(ValueError, match="nested too deeply"):
        loads_strict("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ValueError, match="digits"):
        loads_strict("9" * 5000)


@pytest.mark.parametrize("text", ['{"a": [1, 2.5, "é", null, true], "b": {"c": "d"}}', "[]", '"x"', "-0.25"])
def test_loads_strict_agrees_with_json_on_good_text(text: str) -> None:
    assert loads_strict(text) == json.loads(text)
    assert loads_strict(text.encode()) == json.loads(text)


# --- parameter schemas: what passes ------------------------------------------------------------


def test_empty_schema_normalised() -> None:
    assert check_schema(schema_with()) == {
        "type": "object",
        "properties": {},
        "required": [],
        "additionalProperties": False,
    }


def test_schema_normalised_with_defaults() -> None:
    assert SCHEMA["additionalProperties"] is False
    assert SCHEMA["required"] == ["branch", "count"]
    assert SCHEMA["description"] == "Deploy a branch."
    props = SCHEMA["properties"]
    assert props["branch"] == {"type": "string", "description": "Which branch.", "minLength": 1, "maxLength": 20}
    assert props["note"] == {"type": "string", "maxLength": STRING_MAX}
    assert props["env"] == {"type": "string", "enum": ["staging", "production"]}
    assert props["count"] == COUNT
    assert props["dry_run"] == {"type": "boolean"}


def test_normalising_is_idempotent_and_parse_agrees() -> None:
    assert check_schema(SCHEMA) == SCHEMA
    assert parse_schema(json.dumps(SCHEMA)) == SCHEMA
    assert parse_schema(json.dumps(SCHEMA).encode()) == SCHEMA


def test_schema_edges_pass() -> None:
    props = {f"p{i}": {"type": "boolean"} for i in range(PROPERTIES_MAX)}
    assert len(check_schema({"type": "object", "properties": props})["properties"]) == PROPERTIES_MAX
    bounds = {"type": "string", "minLength": STRING_MAX, "maxLength": STRING_MAX}
    assert check_schema(schema_with(s=bounds))["properties"]["s"] == bounds
    same = {"type": "integer", "minimum": 5, "maximum": 5}
    assert check_schema(schema_with(n=same))["properties"]["n"] == same
    assert check_schema({**schema_with(), "additionalProperties": False, "description": "d" * 1000})
    assert check_schema(schema_with(e={"type": "string", "enum": [str(i) for i in range(100)]}))
    assert check_schema(schema_with(x={"type": "number", "minimum": -1, "maximum": 1e300}))


# --- parameter schemas: the top level ----------------------------------------------------------

TOP_LEVEL_REFUSALS = [
    pytest.param([], "parameters: must be a JSON object (got a list)", id="not-object"),
    pytest.param("{}", "parameters: must be a JSON object (got a string)", id="string"),
    pytest.param({**schema_with(), "x": 1}, "parameters: unknown keyword 'x'", id="unknown"),
    pytest.param({**schema_with(), "$schema": "s"}, "parameters: unknown keyword '$schema'", id="$schema"),
    pytest.param({**schema_with(), "$defs": {}}, "parameters: unknown keyword '$defs'", id="$defs"),
    pytest.param({**schema_with(), "anyOf": []}, "parameters: unknown keyword 'anyOf'", id="anyOf"),
    pytest.param({"properties": {}}, "parameters: type is required", id="no-type"),
    pytest.param({"type": "array", "properties": {}}, "parameters: type must be \"object\" (got 'array')", id="type"),
    pytest.param({"type": "object"}, "parameters: properties is required", id="no-properties"),
    pytest.param({"type": "object", "properties": []}, "parameters.properties: must be an object", id="props-list"),
    pytest.param(
        schema_with(**{f"p{i}": {"type": "boolean"} for i in range(21)}),
        "parameters.properties: at most 20 parameters are allowed (got 21)",
        id="too-many",
    ),
    pytest.param({**schema_with(), "required": "a"}, "parameters: required must be a list", id="required-str"),
    pytest.param(
        {**schema_with(a={"type": "boolean"}), "required": [1]},
        "parameters: required must list parameter names as strings (got 1)",
        id="required-int",
    ),
    pytest.param(
        {**schema_with(a={"type": "boolean"}), "required": ["b"]},
        "parameters: required lists 'b', which is not one of the properties",
        id="required-unknown",
    ),
    pytest.param(
        {**schema_with(a={"type": "boolean"}), "required": ["a", "a"]},
        "parameters: required lists 'a' more than once",
        id="required-dup",
    ),
    pytest.param({**schema_with(), "additionalProperties": True}, "parameters: additionalProperties", id="ap-true"),
    pytest.param({**schema_with(), "additionalProperties": {}}, "parameters: additionalProperties", id="ap-obj"),
    pytest.param({**schema_with(), "additionalProperties": 0}, "parameters: additionalProperties", id="ap-zero"),
    pytest.param({**schema_with(), "description": 5}, "parameters: description must be a string", id="desc-int"),
    pytest.param(
        {**schema_with(), "description": "d" * 1001},
        "parameters: description must be at most 1000 characters (got 1001)",
        id="desc-long",
    ),
    pytest.param(
        {**schema_with(), "description": "a\x00b"}, "parameters: description must not contain a NUL", id="nul"
    ),
]


@pytest.mark.parametrize(("schema", "expected"), TOP_LEVEL_REFUSALS)
def test_top_level_refusals(schema: object, expected: str) -> None:
    assert expected in refused("invalid_tool_schema", check_schema, schema)
    if not isinstance(schema, str):
        assert expected in refused("invalid_tool_schema", parse_schema, json.dumps(schema))


@pytest.mark.parametrize("name", ["Foo", "1a", "a-b", "_a", "a b", "a" * 49, "ünï", ""])
def test_parameter_names_must_be_snake_case(name: str) -> None:
    message = refused("invalid_tool_schema", check_schema, schema_with(**{name: {"type": "boolean"}}))
    assert message.startswith("parameters.properties: parameter name ")
    assert repr(name) in message
    assert "FORGEHAND_ARG_" in message


def test_parameter_names_must_be_strings() -> None:
    message = refused("invalid_tool_schema", check_schema, {"type": "object", "properties": {1: {"type": "boolean"}}})
    assert "parameters.properties: parameter name 1 " in message


# --- parameter schemas: one property -----------------------------------------------------------

PROPERTY_REFUSALS = [
    pytest.param("boolean", "must be an object with a type (got a string)", id="not-object"),
    pytest.param({}, "type is required (one of string, number, integer, boolean)", id="no-type"),
    pytest.param({"type": "object"}, "type 'object' is not allowed: no nesting", id="object"),
    pytest.param({"type": "array", "items": {}}, "type 'array' is not allowed: no nesting", id="array"),
    pytest.param({"type": "null"}, "type must be one of string, number, integer, boolean (got 'null')", id="null"),
    pytest.param({"type": ["string", "null"]}, "type must be one of", id="type-list"),
    pytest.param(
        {"type": "string", "pattern": "^a$"}, "unknown keyword 'pattern' for a string parameter", id="pattern"
    ),
    pytest.param({"type": "string", "default": "a"}, "unknown keyword 'default'", id="default"),
    pytest.param({"type": "string", "format": "uri"}, "unknown keyword 'format'", id="format"),
    pytest.param({"type": "string", "$ref": "#/x"}, "unknown keyword '$ref'", id="ref"),
    pytest.param({"type": "string", "items": {}}, "unknown keyword 'items'", id="items"),
    pytest.param({"type": "string", "properties": {}}, "unknown keyword 'properties'", id="properties"),
    pytest.param({"type": "string", "minimum": 1}, "unknown keyword 'minimum' for a string parameter", id="str-min"),
    pytest.param({"type": "integer", "minimum": 0, "maximum": 1, "maxLength": 3}, "'maxLength' for an integer", id="i"),
    pytest.param({"type": "number", "minimum": 0, "maximum": 1, "enum": [1]}, "'enum' for a number", id="num-enum"),
    pytest.param({"type": "boolean", "enum": [True]}, "unknown keyword 'enum' for a boolean parameter", id="bool-enum"),
    pytest.param({"type": "boolean", "default": False}, "unknown keyword 'default' for a boolean", id="bool-default"),
    pytest.param({"type": "boolean", "description": 1}, "description must be a string (got 1)", id="desc-int"),
    pytest.param({"type": "boolean", "description": "d" * 1001}, "description must be at most 1000", id="desc-long"),
    # strings: lengths
    pytest.param({"type": "string", "maxLength": 8193}, "maxLength must be an integer from 0 to 8192", id="max-big"),
    pytest.param({"type": "string", "maxLength": -1}, "maxLength must be an integer from 0 to 8192 (got -1)", id="neg"),
    pytest.param({"type": "string", "maxLength": "5"}, "maxLength must be an integer from 0 to 8192 (got a", id="str"),
    pytest.param({"type": "string", "maxLength": 5.0}, "maxLength must be an integer from 0 to 8192 (got 5.0)", id="f"),
    pytest.param(
        {"type": "string", "maxLength": True}, "maxLength must be an integer from 0 to 8192 (got true)", id="b"
    ),
    pytest.param(
        {"type": "string", "maxLength": None}, "maxLength must be an integer from 0 to 8192 (got null)", id="n"
    ),
    pytest.param({"type": "string", "minLength": 8193}, "minLength must be an integer from 0 to 8192", id="min-big"),
    pytest.param({"type": "string", "minLength": "1"}, "minLength must be an integer from 0 to 8192", id="min-str"),
    pytest.param({"type": "string", "minLength": 5, "maxLength": 4}, "minLength (5) must not be greater", id="min>max"),
    # strings: enum
    pytest.param({"type": "string", "enum": ["a"], "maxLength": 3}, "enum cannot be combined", id="enum-max"),
    pytest.param({"type": "string", "enum": ["a"], "minLength": 1}, "enum cannot be combined", id="enum-min"),
    pytest.param({"type": "string", "enum": "a"}, "enum must be a list of strings (got a string)", id="enum-str"),
    pytest.param({"type": "string", "enum": []}, "enum must list at least one string", id="enum-empty"),
    pytest.param({"type": "string", "enum": [str(i) for i in range(101)]}, "at most 100 strings (got 101)", id="101"),
    pytest.param({"type": "string", "enum": ["a", 1]}, "enum values must be strings (got 1)", id="enum-int"),
    pytest.param({"type": "string", "enum": ["a", None]}, "enum values must be strings (got null)", id="enum-null"),
    pytest.param({"type": "string", "enum": ["a" * 8193]}, "enum values must be at most 8192 characters", id="long"),
    pytest.param({"type": "string", "enum": ["a", "b", "a"]}, "enum lists 'a' more than once", id="enum-dup"),
    pytest.param({"type": "string", "enum": ["a\x00"]}, "enum value 'a\\x00' must not contain a NUL", id="enum-nul"),
    # numbers and integers
    pytest.param({"type": "integer", "maximum": 1}, "minimum is required for an integer parameter", id="no-min"),
    pytest.param({"type": "number", "minimum": 1}, "maximum is required for a number parameter", id="no-max"),
    pytest.param({"type": "number"}, "minimum is required for a number parameter", id="no-bounds"),
    pytest.param({"type": "number", "minimum": "0", "maximum": 1}, "minimum must be a finite number (got a", id="s"),
    pytest.param(
        {"type": "number", "minimum": 0, "maximum": True}, "maximum must be a finite number (got true)", id="t"
    ),
    pytest.param(
        {"type": "number", "minimum": 0, "maximum": None}, "maximum must be a finite number (got null)", id="0"
    ),
    pytest.param({"type": "number", "minimum": math.nan, "maximum": 1}, "minimum must be a finite number", id="nan"),
    pytest.param({"type": "number", "minimum": 0, "maximum": math.inf}, "maximum must be a finite number", id="inf"),
    pytest.param({"type": "integer", "minimum": 0.5, "maximum": 1}, "minimum must be an integer (got 0.5)", id="i.5"),
    pytest.param({"type": "integer", "minimum": 0, "maximum": 1.0}, "maximum must be an integer (got 1.0)", id="i1.0"),
    pytest.param(
        {"type": "integer", "minimum": "0", "maximum": 1}, "minimum must be an integer (got a string)", id="is"
    ),
    pytest.param(
        {"type": "integer", "minimum": False, "maximum": 1}, "minimum must be an integer (got false)", id="ib"
    ),
    pytest.param({"type": "integer", "minimum": 2, "maximum": 1}, "minimum (2) must not be greater than maximum (1)"),
    pytest.param({"type": "number", "minimum": 0.5, "maximum": 0.25}, "minimum (0.5) must not be greater", id="n>"),
]


@pytest.mark.parametrize(("spec", "expected"), PROPERTY_REFUSALS)
def test_property_refusals_name_the_parameter(spec: object, expected: str) -> None:
    message = refused("invalid_tool_schema", check_schema, schema_with(pick=spec))
    assert message.startswith("parameters.properties.pick: ")
    assert expected in message


def test_property_refusals_from_text_too() -> None:
    text = '{"type": "object", "properties": {"n": {"type": "integer", "minimum": "5", "maximum": 9}}}'
    assert "parameters.properties.n: minimum must be an integer" in refused("invalid_tool_schema", parse_schema, text)


# --- parameter schemas: as text, and their size ------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ('{"type": "object", "properties": {}, "type": "object"}', "duplicate key 'type'"),
        ('{"type": "object", "properties": {"a": {"type": "boolean"}, "a": {"type": "boolean"}}}', "key 'a'"),
        ('{"type": "object", "properties": {"a": {"type": "string", "maxLength": 3, "maxLength": 4}}}', "'maxLength'"),
        ('{"type": "object", "properties": {"n": {"type": "number", "minimum": NaN, "maximum": 1}}}', "NaN"),
        ('{"type": "object", "properties": {"n": {"type": "number", "minimum": 0, "maximum": 1e999}}}', "1e999"),
        (b'{"type": "object", "properties": {}, "description": "\xff"}', "UTF-8"),
        ('{"type": "object",', "not valid JSON"),
        ("", "not valid JSON"),
    ],
)
def test_schema_text_refusals(raw: bytes | str, expected: str) -> None:
    message = refused("invalid_tool_schema", parse_schema, raw)
    assert message.startswith("parameters: not valid JSON: ")
    assert expected in message


def test_schema_text_must_be_text() -> None:
    assert "parameters: must be JSON text" in refused("invalid_tool_schema", parse_schema, 5)


def test_schema_size_limit() -> None:
    at_limit = json.dumps(schema_with()).encode()
    at_limit += b" " * (SCHEMA_MAX_BYTES - len(at_limit))
    assert parse_schema(at_limit)["properties"] == {}
    message = refused("invalid_tool_schema", parse_schema, at_limit + b" ")
    assert message == f"parameters: must be at most 16384 bytes of JSON (got {SCHEMA_MAX_BYTES + 1})"
    # Decoded values are measured as compact UTF-8 JSON: "é" is two bytes.
    big = {**schema_with(), "x": "é" * 8200}
    assert "parameters: must be at most 16384 bytes of JSON" in refused("invalid_tool_schema", check_schema, big)


def test_schema_that_is_not_json_data() -> None:
    loop: dict[str, Any] = schema_with()
    loop["properties"]["self"] = loop
    assert "parameters: must be JSON data" in refused("invalid_tool_schema", check_schema, loop)
    odd = schema_with(e={"type": "string", "enum": {"a"}})
    assert "parameters.properties.e: enum must be a list of strings (got a set)" in refused(
        "invalid_tool_schema", check_schema, odd
    )


# --- inputs: what passes -----------------------------------------------------------------------


def test_good_inputs_pass_in_schema_order() -> None:
    shuffled = dict(reversed(GOOD_INPUTS.items()))
    assert check_inputs(shuffled, SCHEMA) == GOOD_INPUTS
    assert list(check_inputs(shuffled, SCHEMA)) == list(SCHEMA["properties"])
    assert parse_inputs(json.dumps(shuffled), SCHEMA) == GOOD_INPUTS
    assert parse_inputs(json.dumps(GOOD_INPUTS).encode(), SCHEMA) == GOOD_INPUTS


def test_optional_inputs_may_be_absent() -> None:
    assert check_inputs({"branch": "b", "count": 1}, SCHEMA) == {"branch": "b", "count": 1}
    assert check_inputs({}, check_schema(schema_with())) == {}


@pytest.mark.parametrize(
    "text", ["; rm -rf /", "$(id)", "`id`", "a && b || c", "'\"; DROP TABLE x; --", "$HOME ${PATH}", "\n-x\t*", "é😀"]
)
def test_strings_are_never_interpreted(text: str) -> None:
    inputs = {"branch": "x", "count": 1, "note": text}
    assert check_inputs(inputs, SCHEMA)["note"] == text
    assert parse_inputs(json.dumps(inputs), SCHEMA)["note"] == text
    assert env_for(check_inputs(inputs, SCHEMA))["FORGEHAND_ARG_NOTE"] == text


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("branch", "a"),
        ("branch", "b" * 20),
        ("branch", "é" * 20),  # lengths count characters, not bytes
        ("count", 1),
        ("count", 10),
        ("ratio", -0.5),
        ("ratio", 2.5),
        ("ratio", 2),  # an integer is a number
        ("dry_run", False),
        ("env", "production"),
        ("note", ""),
        ("note", "n" * STRING_MAX),
    ],
)
def test_inputs_at_their_edges_pass(name: str, value: object) -> None:
    inputs = {"branch": "b", "count": 1, name: value}
    assert check_inputs(inputs, SCHEMA)[name] == value


def test_schema_is_normalised_before_inputs_are_checked() -> None:
    raw_schema = schema_with(note={"type": "string"})  # no required, no maxLength yet
    assert check_inputs({}, raw_schema) == {}
    message = refused("invalid_tool_inputs", check_inputs, {"note": "n" * (STRING_MAX + 1)}, raw_schema)
    assert message == f"inputs.note: must be from 0 to {STRING_MAX} characters long (got {STRING_MAX + 1})"
    bad_schema = schema_with(note={"type": "object"})
    assert "parameters.properties.note" in refused("invalid_tool_schema", check_inputs, {}, bad_schema)
    assert "parameters.properties.note" in refused("invalid_tool_schema", parse_inputs, "{}", bad_schema)


# --- inputs: refusals --------------------------------------------------------------------------

INPUT_REFUSALS = [
    pytest.param({"x": 1}, "inputs: unknown parameter 'x' (this tool takes: branch, env, count", id="unknown"),
    pytest.param({"branch": "b"}, "inputs.count: required parameter is missing", id="missing"),
    pytest.param({"count": 1}, "inputs.branch: required parameter is missing", id="missing-branch"),
    # strings
    pytest.param({"branch": 5}, "inputs.branch: must be a string (got 5)", id="str-int"),
    pytest.param({"branch": None}, "inputs.branch: must be a string (got null)", id="str-null"),
    pytest.param({"branch": ["a"]}, "inputs.branch: must be a string (got a list)", id="str-list"),
    pytest.param({"branch": {"a": 1}}, "inputs.branch: must be a string (got an object)", id="str-obj"),
    pytest.param({"branch": True}, "inputs.branch: must be a string (got true)", id="str-bool"),
    pytest.param({"branch": ""}, "inputs.branch: must be from 1 to 20 characters long (got 0)", id="short"),
    pytest.param({"branch": "b" * 21}, "inputs.branch: must be from 1 to 20 characters long (got 21)", id="long"),
    pytest.param({"branch": "a\x00b"}, "inputs.branch: must not contain a NUL character", id="nul"),
    pytest.param({"branch": "a\ud800"}, "inputs.branch: must be valid Unicode text", id="surrogate"),
    pytest.param({"env": "dev"}, "inputs.env: must be one of 'staging', 'production' (got 'dev')", id="enum"),
    pytest.param({"env": "Staging"}, "inputs.env: must be one of", id="enum-case"),
    pytest.param({"env": 1}, "inputs.env: must be a string (got 1)", id="enum-int"),
    # integers
    pytest.param({"count": "5"}, "inputs.count: must be an integer from 1 to 10 (got a string)", id="int-str"),
    pytest.param({"count": 5.0}, "inputs.count: must be an integer from 1 to 10 (got 5.0)", id="int-float"),
    pytest.param({"count": 1.5}, "inputs.count: must be an integer from 1 to 10 (got 1.5)", id="int-frac"),
    pytest.param({"count": True}, "inputs.count: must be an integer from 1 to 10 (got true)", id="int-bool"),
    pytest.param({"count": None}, "inputs.count: must be an integer from 1 to 10 (got null)", id="int-null"),
    pytest.param({"count": 0}, "inputs.count: must be an integer from 1 to 10 (got 0)", id="int-low"),
    pytest.param({"count": 11}, "inputs.count: must be an integer from 1 to 10 (got 11)", id="int-high"),
    pytest.param({"count": 10**30}, "inputs.count: must be an integer from 1 to 10 (got 1000", id="int-huge"),
    # numbers
    pytest.param({"ratio": "0.5"}, "inputs.ratio: must be a number from -0.5 to 2.5 (got a string)", id="num-str"),
    pytest.param({"ratio": False}, "inputs.ratio: must be a number from -0.5 to 2.5 (got false)", id="num-bool"),
    pytest.param({"ratio": math.nan}, "inputs.ratio: must be a number from -0.5 to 2.5 (got nan)", id="num-nan"),
    pytest.param({"ratio": math.inf}, "inputs.ratio: must be a number from -0.5 to 2.5 (got inf)", id="num-inf"),
    pytest.param({"ratio": -0.51}, "inputs.ratio: must be a number from -0.5 to 2.5 (got -0.51)", id="num-low"),
    pytest.param({"ratio": 3}, "inputs.ratio: must be a number from -0.5 to 2.5 (got 3)", id="num-high"),
    # booleans
    pytest.param({"dry_run": "true"}, "inputs.dry_run: must be true or false (got a string)", id="bool-str"),
    pytest.param({"dry_run": 1}, "inputs.dry_run: must be true or false (got 1)", id="bool-one"),
    pytest.param({"dry_run": 0}, "inputs.dry_run: must be true or false (got 0)", id="bool-zero"),
    pytest.param({"dry_run": None}, "inputs.dry_run: must be true or false (got null)", id="bool-null"),
]


@pytest.mark.parametrize(("changes", "expected"), INPUT_REFUSALS)
def test_input_refusals_name_the_parameter(changes: dict[str, Any], expected: str) -> None:
    inputs = {"branch": "b", "count": 1, **changes}
    if "missing" in expected:
        inputs = changes
    assert expected in refused("invalid_tool_inputs", check_inputs, inputs, SCHEMA)
    if all(isinstance(v, str | bool | int | None | list | dict) for v in changes.values()):
        assert expected in refused("invalid_tool_inputs", parse_inputs, json.dumps(inputs), SCHEMA)


@pytest.mark.parametrize(("inputs", "got"), [([], "a list"), ("x", "a string"), (None, "null"), (3, "3")])
def test_inputs_must_be_an_object(inputs: object, got: str) -> None:
    message = refused("invalid_tool_inputs", check_inputs, inputs, SCHEMA)
    assert message == f"inputs: must be a JSON object (got {got})"
    message = refused("invalid_tool_inputs", parse_inputs, json.dumps(inputs), SCHEMA)
    assert message == f"inputs: must be a JSON object (got {got})"


def test_a_tool_without_parameters_takes_none() -> None:
    message = refused("invalid_tool_inputs", check_inputs, {"x": 1}, schema_with())
    assert message == "inputs: unknown parameter 'x' (this tool takes: no parameters)"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ('{"branch": "a", "count": 1, "count": 2}', "duplicate key 'count'"),
        ('{"branch": "a", "count": 1, "ratio": NaN}', "NaN"),
        ('{"branch": "a", "count": 1, "ratio": Infinity}', "Infinity"),
        (b'{"branch": "\xff", "count": 1}', "UTF-8"),
        ('{"branch": "a",', "not valid JSON"),
    ],
)
def test_input_text_refusals(raw: bytes | str, expected: str) -> None:
    message = refused("invalid_tool_inputs", parse_inputs, raw, SCHEMA)
    assert message.startswith("inputs: not valid JSON: ")
    assert expected in message


def test_escaped_surrogates_and_nul_in_input_text() -> None:
    message = refused("invalid_tool_inputs", parse_inputs, '{"branch": "\\ud800", "count": 1}', SCHEMA)
    assert message.startswith("inputs.branch: must be valid Unicode text")
    message = refused("invalid_tool_inputs", parse_inputs, '{"branch": "a\\u0000", "count": 1}', SCHEMA)
    assert message == "inputs.branch: must not contain a NUL character"


def test_inputs_size_limit() -> None:
    schema = check_schema(schema_with(a={"type": "string"}, b={"type": "string"}, c={"type": "string"}))
    over = {"a": "a" * STRING_MAX, "b": "b" * STRING_MAX}
    message = refused("invalid_tool_inputs", check_inputs, over, schema)
    assert message.startswith("inputs: must be at most 16384 bytes of JSON (got ")
    assert "inputs: must be at most 16384 bytes" in refused(
        "invalid_tool_inputs", parse_inputs, json.dumps(over), schema
    )
    padded = json.dumps({"a": "x"}).encode()
    padded += b" " * (INPUTS_MAX_BYTES - len(padded))
    assert parse_inputs(padded, schema) == {"a": "x"}
    assert "inputs: must be at most" in refused("invalid_tool_inputs", parse_inputs, padded + b" ", schema)


# --- hash and environment ----------------------------------------------------------------------


def test_inputs_hash_is_the_policy_hash() -> None:
    inputs = check_inputs(GOOD_INPUTS, SCHEMA)
    assert inputs_hash(inputs) == input_hash(inputs)
    assert inputs_hash(inputs) == inputs_hash(dict(reversed(inputs.items())))
    assert inputs_hash(inputs) != inputs_hash({**inputs, "count": 4})
    assert re.fullmatch(r"[0-9a-f]{64}", inputs_hash(inputs))


def test_env_for() -> None:
    assert env_for(check_inputs(GOOD_INPUTS, SCHEMA)) == {
        "FORGEHAND_ARG_BRANCH": "main",
        "FORGEHAND_ARG_ENV": "staging",
        "FORGEHAND_ARG_COUNT": "3",
        "FORGEHAND_ARG_RATIO": "0.5",
        "FORGEHAND_ARG_DRY_RUN": "true",
        "FORGEHAND_ARG_NOTE": "hi",
    }


def test_env_for_leaves_absent_inputs_absent() -> None:
    assert env_for(check_inputs({"branch": "b", "count": 1}, SCHEMA)) == {
        "FORGEHAND_ARG_BRANCH": "b",
        "FORGEHAND_ARG_COUNT": "1",
    }


@pytest.mark.parametrize(
    ("value", "text"), [(False, "false"), (True, "true"), (-3, "-3"), (2.0, "2.0"), (1e20, "1e+20"), ("5", "5")]
)
def test_env_text_of_each_kind(value: object, text: str) -> None:
    assert env_for({"v": value}) == {"FORGEHAND_ARG_V": text}
