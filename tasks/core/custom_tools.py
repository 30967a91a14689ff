"""What an agent on a repository is offered of the custom tools (docs/tools.md): the enabled tools
with an active version, the instance's and the repository's merged by name (a repository's tool
replaces the instance's of the same name). Read by the task start form, `GET .../tools?for=agents`
and every run when it opens its back-channel."""

from typing import Any

import msgspec
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from tasks.core.models import CustomTool, CustomToolVersion

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
