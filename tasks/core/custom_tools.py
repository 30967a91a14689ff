"""What a custom tool is (docs/tools.md): a version's definition and its rules (`check_definition`;
the parameter schema's are tool_schema.py's), adding a version, and the catalog an agent on a
repository is offered: the enabled tools with an active version, the instance's and the
repository's merged by name (a repository's tool replaces the instance's of the same name), read by
the task start form, `GET .../tools?for=agents` and every run when it opens its back-channel."""

from typing import Any

import msgspec
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from forge.core.errors import InvalidInput
from tasks.core import tool_schema
from tasks.core.custom_tool_schemas import (
    DESCRIPTION_MAX,
    INTERPRETER_NAMES,
    MODES,
    SCRIPT_MAX_BYTES,
    TIMEOUT_MAX,
    TIMEOUT_MIN,
)
from tasks.core.tool_models import CustomTool, CustomToolVersion

INSTANCE_SCOPE = "instance"
AGENT_PREFIX = "custom_"


class ActiveTool(msgspec.Struct, frozen=True, kw_only=True):
    """A tool an agent on a repository is offered: its active version's definition."""

    tool_id: int
    name: str
    scope: str
    version: int
    description: str
    parameters: dict[str, Any]
    script: str
    interpreter: str
    mode: str
    read_only: bool
    timeout_seconds: int
    shadows_instance_tool: bool = False

    @property
    def agent_name(self) -> str:
        return AGENT_PREFIX + self.name


async def catalog(session: AsyncSession, repo_id: int) -> list[ActiveTool]:
    """The enabled tools with an active version, instance and repository merged (by name)."""
    stmt = (
        select(CustomTool, CustomToolVersion)
        .join(CustomToolVersion, CustomToolVersion.tool_id == CustomTool.id)
        .where(
            CustomTool.scope.in_((INSTANCE_SCOPE, f"repo:{repo_id}")),
            CustomTool.enabled.is_(True),
            CustomToolVersion.version == CustomTool.active_version,
        )
    )
    merged: dict[str, ActiveTool] = {}
    rows = sorted((await session.execute(stmt)).tuples(), key=lambda r: r[0].repo_id is not None)
    for tool, v in rows:  # instance tools first: a repository's tool of the same name replaces it
        merged[tool.name] = ActiveTool(
            tool_id=tool.id, name=tool.name, scope="instance" if tool.repo_id is None else "repository",
            version=v.version, description=v.description, parameters=v.parameters, script=v.script,
            interpreter=v.interpreter, mode=v.mode, read_only=v.read_only, timeout_seconds=v.timeout_seconds,
            shadows_instance_tool=tool.repo_id is not None and tool.name in merged,
        )  # fmt: skip
    return [merged[n] for n in sorted(merged)]


# --- a definition, checked (every version is one) -------------------------------------------


def invalid(exc: tool_schema.ToolSchemaError) -> InvalidInput:
    return InvalidInput(exc.message, code=exc.code)


class Definition(msgspec.Struct, kw_only=True):
    """A version's fields, checked."""

    description: str
    parameters: dict[str, Any]
    script: str
    interpreter: str
    mode: str
    read_only: bool
    timeout_seconds: int


def _definition_error(message: str) -> InvalidInput:
    return InvalidInput(message, code="invalid_tool_definition")


def check_definition(d: Definition) -> Definition:
    """The non-schema rules (the parameter schema was checked as it was parsed)."""
    if len(d.script.encode()) > SCRIPT_MAX_BYTES or not d.script.strip():
        raise _definition_error(f"script: a non-empty script of at most {SCRIPT_MAX_BYTES // 1024} KiB")
    if "\x00" in d.script or "\x00" in d.description:
        raise _definition_error("script and description must not contain NUL characters")
    if len(d.description) > DESCRIPTION_MAX:
        raise _definition_error(f"description: at most {DESCRIPTION_MAX} characters")
    if d.interpreter not in INTERPRETER_NAMES:
        raise _definition_error(f"interpreter: one of {', '.join(INTERPRETER_NAMES)} (got {d.interpreter[:40]!r})")
    if isinstance(d.timeout_seconds, bool) or not TIMEOUT_MIN <= d.timeout_seconds <= TIMEOUT_MAX:
        raise _definition_error(f"timeout_seconds: from {TIMEOUT_MIN} to {TIMEOUT_MAX}")
    if d.mode not in MODES:
        raise InvalidInput(f"mode: one of {', '.join(MODES)} (got {d.mode[:40]!r})", code="invalid_tool_mode")
    if d.mode == "auto" and not d.read_only:
        raise InvalidInput(
            "mode: `auto` runs without a person's approval and is only for a tool marked read_only "
            "(set read_only: true if the script changes nothing, or use mode `approval`)",
            code="invalid_tool_mode",
        )
    return d


def check_parameters(value: dict[str, Any]) -> dict[str, Any]:
    try:
        return tool_schema.check_schema(value)
    except tool_schema.ToolSchemaError as exc:
        raise invalid(exc) from None


def check_name(name: str) -> str:
    try:
        return tool_schema.check_name(name)
    except tool_schema.ToolSchemaError as exc:
        raise invalid(exc) from None


def add_version(
    session: AsyncSession,
    tool: CustomTool,
    number: int,
    d: Definition,
    account_id: int | None,
    proposed_by_task: int | None,
) -> CustomToolVersion:
    row = CustomToolVersion(
        tool_id=tool.id, version=number, description=d.description, parameters=d.parameters, script=d.script,
        interpreter=d.interpreter, mode=d.mode, read_only=d.read_only, timeout_seconds=d.timeout_seconds,
        created_by_id=account_id, proposed_by_task_id=proposed_by_task,
    )  # fmt: skip
    session.add(row)
    return row
