"""The wire shapes of custom tools (docs/tools.md): what the REST API takes and answers for a tool,
its versions, what agents see, and a tool's runs. The rules on a tool's parameter schema and a
call's inputs are `tool_schema.py`'s; the limits on the other fields are here."""

from datetime import datetime
from typing import Annotated, Any

import msgspec

SCRIPT_MAX_BYTES = 64 * 1024
DESCRIPTION_MAX = 4000
TIMEOUT_MIN = 10
TIMEOUT_MAX = 1800
TIMEOUT_DEFAULT = 600
INTERPRETER_NAMES = ("sh", "bash", "python3", "node")
MODES = ("approval", "auto")
# Integers of a request body are bounded (docs/api.md); the tool's own rules (10 to 1800 s...)
# are checked after, with their own error codes.
Seconds = Annotated[int, msgspec.Meta(ge=0, le=1_000_000)]
VersionNumber = Annotated[int, msgspec.Meta(ge=1, le=1_000_000)]
# How long an `approval` call waits for a person before it expires (and runs nothing).
APPROVAL_TTL_SECONDS = 3600


class ToolCreate(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A new tool; its first version is a draft (activate it to offer it to agents). The request's
    JSON text is checked for duplicate keys before it is decoded (`tool_schema.loads_strict`)."""

    name: str
    script: str
    parameters: dict[str, Any] = msgspec.field(default_factory=lambda: {"type": "object", "properties": {}})
    description: str = ""
    interpreter: str = "sh"
    mode: str = "approval"
    read_only: bool = False
    timeout_seconds: Seconds = TIMEOUT_DEFAULT


class ToolUpdate(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A change: any definition field makes a new draft version from the latest one; `enabled`
    alone switches the tool on or off without a new version."""

    script: str | None = None
    parameters: dict[str, Any] | None = None
    description: str | None = None
    interpreter: str | None = None
    mode: str | None = None
    read_only: bool | None = None
    timeout_seconds: Seconds | None = None
    enabled: bool | None = None


class ActivateVersion(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    version: VersionNumber


class TestRunRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    inputs: dict[str, Any] = msgspec.field(default_factory=dict)
    version: VersionNumber | None = None  # the active version, or the latest when none is active


class ToolVersionRead(msgspec.Struct, kw_only=True):
    version: int
    active: bool
    description: str
    parameters: dict[str, Any]
    script: str
    interpreter: str
    mode: str
    read_only: bool
    timeout_seconds: int
    created_by: str | None
    proposed_by_task: int | None  # an agent's proposal: the task whose run proposed it
    created_at: datetime


class ToolRead(msgspec.Struct, kw_only=True):
    id: int
    name: str
    agent_name: str  # what agents call it: custom_<name>
    scope: str  # "instance" or "repository"
    repository: str | None  # owner/name of a repository's tool
    enabled: bool
    active_version: int | None
    latest_version: int
    created_by: str | None
    created_at: datetime
    updated_at: datetime
    latest: ToolVersionRead
    active: ToolVersionRead | None


class AgentToolRead(msgspec.Struct, kw_only=True):
    """A tool as an agent on this repository sees it (`GET .../tools?for=agents`)."""

    name: str  # custom_<name>
    tool_id: int
    scope: str
    version: int
    description: str
    parameters: dict[str, Any]
    mode: str
    read_only: bool
    shadows_instance_tool: bool  # a repository tool of the same name hides the instance's


class ToolRunRead(msgspec.Struct, kw_only=True):
    id: int
    tool_id: int
    tool: str
    version: int
    state: str  # awaiting_approval, queued, running, succeeded, failed, denied, expired, cancelled
    inputs: dict[str, Any]
    inputs_hash: str
    exit_code: int | None
    output: str
    failure_reason: str | None
    repository: str | None
    task: int | None  # the task's number; None: an admin's test run
    requested_by: str | None
    decided_by: str | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    duration_ms: int | None
    expires_at: datetime | None
