"""Custom tools' definitions and versions (docs/tools.md): create, change (a new draft version),
activate, restore, switch on or off, read; and the catalog an agent on a repository is offered
(instance and repository tools merged, a repository's shadowing the instance's of the same name).

Who may: a repository's tools are its admins' (`repo.admin`), the instance's the instance admins';
what an agent will see (`?for=agents`) anyone who may start a task there. Every change audited."""

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from forge.core.access import INSTANCE, Action, Principal, require
from forge.core.errors import Conflict, InvalidInput, NotFound
from forge.db import audit
from forge.db.audit import Actor
from forge.db.models import Account, Repository
from forge.repos.repositories import RepoResource
from tasks.core.custom_tool_schemas import (
    AgentToolRead,
    ToolCreate,
    ToolRead,
    ToolUpdate,
    ToolVersionRead,
)
from tasks.core.custom_tools import (
    AGENT_PREFIX,
    INSTANCE_SCOPE,
    Definition,
    add_version,
    catalog,
    check_definition,
    check_name,
    check_parameters,
)
from tasks.core.models import Task
from tasks.core.tool_models import CustomTool, CustomToolVersion
from tasks.services import rules

TOOLS_MAX_PER_SCOPE = 100


def scope_key(res: RepoResource | None) -> str:
    return INSTANCE_SCOPE if res is None else f"repo:{res.repo.id}"


def require_admin(principal: Principal, res: RepoResource | None) -> None:
    """A repository's tools are its admins'; the instance's, the instance admins'."""
    if res is None:
        require(principal, Action.INSTANCE_ADMIN, INSTANCE)
    else:
        rules.require_configure(principal, res)


# --- checking a definition -------------------------------------------------------------------


def definition_of_create(data: ToolCreate) -> Definition:
    return check_definition(
        Definition(
            description=data.description.strip(), parameters=check_parameters(data.parameters), script=data.script,
            interpreter=data.interpreter, mode=data.mode, read_only=data.read_only,
            timeout_seconds=data.timeout_seconds,
        )
    )  # fmt: skip


def definition_of_update(latest: CustomToolVersion, data: ToolUpdate) -> Definition:
    return check_definition(
        Definition(
            description=latest.description if data.description is None else data.description.strip(),
            parameters=latest.parameters if data.parameters is None else check_parameters(data.parameters),
            script=latest.script if data.script is None else data.script,
            interpreter=data.interpreter or latest.interpreter,
            mode=data.mode or latest.mode,
            read_only=latest.read_only if data.read_only is None else data.read_only,
            timeout_seconds=latest.timeout_seconds if data.timeout_seconds is None else data.timeout_seconds,
        )
    )


def changes_definition(data: ToolUpdate) -> bool:
    fields = ("script", "parameters", "description", "interpreter", "mode", "read_only", "timeout_seconds")
    return any(getattr(data, f) is not None for f in fields)


# --- reading ---------------------------------------------------------------------------------


async def _logins(session: AsyncSession, ids: set[int | None]) -> dict[int, str]:
    wanted = {i for i in ids if i is not None}
    if not wanted:
        return {}
    rows = await session.execute(select(Account.id, Account.login).where(Account.id.in_(wanted)))
    return dict(rows.tuples().all())


async def _task_numbers(session: AsyncSession, ids: set[int | None]) -> dict[int, int]:
    wanted = {i for i in ids if i is not None}
    if not wanted:
        return {}
    rows = await session.execute(select(Task.id, Task.number).where(Task.id.in_(wanted)))
    return dict(rows.tuples().all())


def version_read(
    v: CustomToolVersion, tool: CustomTool, logins: dict[int, str], tasks: dict[int, int]
) -> ToolVersionRead:
    return ToolVersionRead(
        version=v.version, active=tool.active_version == v.version, description=v.description,
        parameters=v.parameters, script=v.script, interpreter=v.interpreter, mode=v.mode, read_only=v.read_only,
        timeout_seconds=v.timeout_seconds,
        created_by=logins.get(v.created_by_id) if v.created_by_id else None,
        proposed_by_task=tasks.get(v.proposed_by_task_id) if v.proposed_by_task_id else None,
        created_at=v.created_at,
    )  # fmt: skip


async def versions_of(session: AsyncSession, tool: CustomTool) -> list[CustomToolVersion]:
    stmt = select(CustomToolVersion).where(CustomToolVersion.tool_id == tool.id).order_by(CustomToolVersion.version)
    return list((await session.scalars(stmt)).all())


async def version(session: AsyncSession, tool: CustomTool, number: int) -> CustomToolVersion:
    stmt = select(CustomToolVersion).where(CustomToolVersion.tool_id == tool.id, CustomToolVersion.version == number)
    found = await session.scalar(stmt)
    if found is None:
        raise NotFound(f"tool {tool.name} has no version {number} (its versions are 1 to {tool.last_version})")
    return found


async def version_reads(session: AsyncSession, tool: CustomTool) -> list[ToolVersionRead]:
    """Every version of `tool`, oldest first."""
    rows = await versions_of(session, tool)
    logins = await _logins(session, {v.created_by_id for v in rows})
    tasks = await _task_numbers(session, {v.proposed_by_task_id for v in rows})
    return [version_read(v, tool, logins, tasks) for v in rows]


async def reads(session: AsyncSession, tools: Sequence[CustomTool]) -> list[ToolRead]:
    """Tools as the API answers them, each with its latest and its active version."""
    out: list[ToolRead] = []
    versions = {t.id: {v.version: v for v in await versions_of(session, t)} for t in tools}
    every = [v for vs in versions.values() for v in vs.values()]
    logins = await _logins(session, {t.created_by_id for t in tools} | {v.created_by_id for v in every})
    tasks = await _task_numbers(session, {v.proposed_by_task_id for v in every})
    repos = await _repo_names(session, {t.repo_id for t in tools})
    for t in tools:
        own = versions[t.id]
        active = own.get(t.active_version) if t.active_version is not None else None
        out.append(
            ToolRead(
                id=t.id, name=t.name, agent_name=AGENT_PREFIX + t.name,
                scope="instance" if t.repo_id is None else "repository",
                repository=repos.get(t.repo_id) if t.repo_id is not None else None,
                enabled=t.enabled, active_version=t.active_version, latest_version=t.last_version,
                created_by=logins.get(t.created_by_id) if t.created_by_id else None,
                created_at=t.created_at, updated_at=t.updated_at,
                latest=version_read(own[t.last_version], t, logins, tasks),
                active=version_read(active, t, logins, tasks) if active is not None else None,
            )
        )  # fmt: skip
    return out


async def _repo_names(session: AsyncSession, ids: set[int | None]) -> dict[int, str]:
    wanted = {i for i in ids if i is not None}
    out: dict[int, str] = {}
    for repo_id in wanted:
        repo = await session.get(Repository, repo_id)
        if repo is not None:
            out[repo_id] = f"{repo.owner.login}/{repo.name}"
    return out


async def of_scope(session: AsyncSession, principal: Principal, res: RepoResource | None) -> list[CustomTool]:
    require_admin(principal, res)
    stmt = select(CustomTool).where(CustomTool.scope == scope_key(res)).order_by(CustomTool.name)
    return list((await session.scalars(stmt)).all())


async def get(session: AsyncSession, principal: Principal, res: RepoResource | None, tool_id: int) -> CustomTool:
    require_admin(principal, res)
    tool = await session.get(CustomTool, tool_id)
    if tool is None or tool.scope != scope_key(res):
        where = "this instance" if res is None else f"{res.repo.name}"
        raise NotFound(f"no tool {tool_id} on {where}", code="not_found")
    return tool


# --- changing --------------------------------------------------------------------------------


def _target(tool: CustomTool, res: RepoResource | None) -> str:
    return f"tool:{tool.name}" if res is None else f"{res.repo.owner.login}/{res.repo.name}:tool:{tool.name}"


async def create(
    session: AsyncSession,
    actor: Actor,
    res: RepoResource | None,
    data: ToolCreate,
    *,
    proposed_by_task: int | None = None,
) -> CustomTool:
    """A new tool with its draft version 1 (not offered to agents until activated)."""
    if proposed_by_task is None:
        require_admin(actor.principal, res)
    name = check_name(data.name)
    d = definition_of_create(data)
    count = len((await session.scalars(select(CustomTool.id).where(CustomTool.scope == scope_key(res)))).all())
    if count >= TOOLS_MAX_PER_SCOPE:
        raise InvalidInput(f"at most {TOOLS_MAX_PER_SCOPE} tools per scope", code="invalid_tool_name")
    tool = CustomTool(
        scope=scope_key(res), repo_id=res.repo.id if res else None, name=name, enabled=True, last_version=1,
        created_by_id=actor.principal.account_id,
    )  # fmt: skip
    session.add(tool)
    try:
        async with session.begin_nested():
            await session.flush()
    except IntegrityError:
        raise Conflict(f"a tool named {name} exists already here; change it instead", code="conflict") from None
    add_version(session, tool, 1, d, actor.principal.account_id, proposed_by_task)
    await session.flush()
    audit.record(
        session, actor, "tool.create", _target(tool, res), version=1, mode=d.mode, proposed=bool(proposed_by_task)
    )
    return tool


async def update(
    session: AsyncSession, actor: Actor, res: RepoResource | None, tool: CustomTool, data: ToolUpdate
) -> None:
    """A definition change is a new draft version; `enabled` switches the tool on or off."""
    require_admin(actor.principal, res)
    if changes_definition(data):
        latest = await version(session, tool, tool.last_version)
        d = definition_of_update(latest, data)
        tool.last_version += 1
        # A version keeps the agent's proposal it took its script from: an admin's other change
        # never makes an agent's script look like the admin's own.
        proposed = latest.proposed_by_task_id if data.script is None else None
        add_version(session, tool, tool.last_version, d, actor.principal.account_id, proposed)
        audit.record(session, actor, "tool.version.create", _target(tool, res), version=tool.last_version)
    if data.enabled is not None and data.enabled != tool.enabled:
        tool.enabled = data.enabled
        audit.record(session, actor, "tool.enable" if data.enabled else "tool.disable", _target(tool, res))
    await session.flush()


async def activate(
    session: AsyncSession, actor: Actor, res: RepoResource | None, tool: CustomTool, number: int
) -> None:
    """Offer version `number` to agents from now on (calls already made keep the version they named)."""
    require_admin(actor.principal, res)
    await version(session, tool, number)
    tool.active_version = number
    await session.flush()
    audit.record(session, actor, "tool.activate", _target(tool, res), version=number)


async def restore(session: AsyncSession, actor: Actor, res: RepoResource | None, tool: CustomTool, number: int) -> int:
    """An old version's definition as a new draft version (history is never rewritten)."""
    require_admin(actor.principal, res)
    old = await version(session, tool, number)
    d = Definition(
        description=old.description, parameters=old.parameters, script=old.script, interpreter=old.interpreter,
        mode=old.mode, read_only=old.read_only, timeout_seconds=old.timeout_seconds,
    )  # fmt: skip
    tool.last_version += 1
    add_version(session, tool, tool.last_version, d, actor.principal.account_id, old.proposed_by_task_id)
    await session.flush()
    audit.record(session, actor, "tool.version.restore", _target(tool, res), version=tool.last_version, source=number)
    return tool.last_version


# --- what agents see -------------------------------------------------------------------------


async def for_agents(session: AsyncSession, principal: Principal, res: RepoResource) -> list[AgentToolRead]:
    rules.require_start(principal, res)
    return [
        AgentToolRead(
            name=t.agent_name, tool_id=t.tool_id, scope=t.scope, version=t.version, description=t.description,
            parameters=t.parameters, mode=t.mode, read_only=t.read_only,
            shadows_instance_tool=t.shadows_instance_tool,
        )
        for t in await catalog(session, res.repo.id)
    ]  # fmt: skip
