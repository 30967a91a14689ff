"""REST for custom tools (docs/tools.md): a repository's (`/api/v1/repos/{o}/{n}/tools`, its admins)
and the instance's (`/api/v1/admin/tools`, instance admins), their versions, test runs, run history,
and a person's decision on a call that waits for approval. Thin: the services decide who may."""

from typing import Annotated, Any

import msgspec
from litestar import Controller, Request, get, patch, post
from litestar.params import FromPath, FromQuery, JSONBody, QueryParameter

from forge.core.access import Action
from forge.core.errors import InvalidInput, NotFound
from forge.http.auth import signed_in
from forge.http.deps import ActorDep, DbSession
from forge.repos import repositories
from forge.repos.repositories import RepoResource
from tasks.core import tool_schema
from tasks.core.custom_tool_schemas import (
    ActivateVersion,
    AgentToolRead,
    TestRunRequest,
    ToolCreate,
    ToolRead,
    ToolRunRead,
    ToolUpdate,
    ToolVersionRead,
)
from tasks.core.tool_models import CustomTool
from tasks.http.deps import DEPENDENCIES, SystemDep
from tasks.run.tool_trial import trial_run
from tasks.services import custom_tools, tool_runs
from tasks.system import TaskSystem

TOOLS = "/api/v1/repos/{owner:str}/{name:str}/tools"
TOOL = TOOLS + "/{tool_id:int}"
TOOL_RUN = "/api/v1/repos/{owner:str}/{name:str}/tool-runs/{run_id:int}"
ADMIN_TOOLS = "/api/v1/admin/tools"
ADMIN_TOOL = ADMIN_TOOLS + "/{tool_id:int}"


class Decision(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    reason: Annotated[str, msgspec.Meta(max_length=2000)] = ""


async def _repo(
    db: DbSession, actor: ActorDep, owner: str, name: str, action: Action = Action.REPO_READ
) -> RepoResource:
    return await repositories.load(db, actor.principal, owner, name, action)


async def no_duplicate_keys(request: Request[Any, Any, Any], code: str) -> None:
    """A key twice in the request's JSON is refused (decoding would keep the last one silently)."""
    try:
        tool_schema.loads_strict(await request.body())
    except ValueError as exc:
        raise InvalidInput(f"the request body: {exc}", code=code) from None


async def _read(db: DbSession, tool: CustomTool) -> ToolRead:
    [read] = await custom_tools.reads(db, [tool])
    return read


async def _test_run(
    system: TaskSystem, actor: ActorDep, where: tuple[str, str] | None, tool_id: int, data: TestRunRequest
) -> ToolRunRead:
    """No request transaction is held across the run (it may take minutes): the checks read in a
    session of their own, the run records itself, the answer is read afterwards."""
    async with system.db.session() as s:
        res = await _repo(s, actor, *where) if where is not None else None
        tool = await custom_tools.get(s, actor.principal, res, tool_id)
        version = await custom_tools.version(s, tool, data.version or tool.active_version or tool.last_version)
    inputs = data.inputs
    engine = system.worker.engine if system.worker is not None else None
    run_id = await trial_run(system.db, system.store, system.settings, actor, tool, version, inputs, engine=engine)
    async with system.db.session() as s:
        [read] = await tool_runs.reads(s, [await tool_runs.get(s, actor.principal, res, run_id)])
    return read


class RepoToolController(Controller):
    tags = ["tools"]
    dependencies = DEPENDENCIES

    @get(TOOLS, summary="The repository's custom tools (admins); `?for=agents`: what an agent here is offered")
    async def list_tools(
        self, db_session: DbSession, actor: ActorDep, owner: FromPath[str], name: FromPath[str],
        for_: Annotated[str | None, QueryParameter(name="for")] = None,
    ) -> list[ToolRead] | list[AgentToolRead]:  # fmt: skip
        res = await _repo(db_session, actor, owner, name)
        if for_ == "agents":
            return await custom_tools.for_agents(db_session, actor.principal, res)
        if for_ is not None:
            raise InvalidInput("for: only `agents` is known (`?for=agents`: what an agent here is offered)")
        return await custom_tools.reads(db_session, await custom_tools.of_scope(db_session, actor.principal, res))

    @post(TOOLS, summary="Create a custom tool (its version 1 is a draft until activated)", status_code=201)
    async def create_tool(
        self, db_session: DbSession, actor: ActorDep, owner: FromPath[str], name: FromPath[str],
        request: Request[Any, Any, Any], data: JSONBody[ToolCreate],
    ) -> ToolRead:  # fmt: skip
        await no_duplicate_keys(request, "invalid_tool_schema")
        res = await _repo(db_session, actor, owner, name)
        return await _read(db_session, await custom_tools.create(db_session, actor, res, data))

    @get(TOOL, summary="A custom tool, with its latest and its active version")
    async def get_tool(
        self,
        db_session: DbSession,
        actor: ActorDep,
        owner: FromPath[str],
        name: FromPath[str],
        tool_id: FromPath[int],
    ) -> ToolRead:
        res = await _repo(db_session, actor, owner, name)
        return await _read(db_session, await custom_tools.get(db_session, actor.principal, res, tool_id))

    @patch(TOOL, summary="Change a tool (a new draft version), or switch it on or off (`enabled`)")
    async def update_tool(
        self, db_session: DbSession, actor: ActorDep, owner: FromPath[str], name: FromPath[str], tool_id: FromPath[int],
        request: Request[Any, Any, Any], data: JSONBody[ToolUpdate],
    ) -> ToolRead:  # fmt: skip
        await no_duplicate_keys(request, "invalid_tool_schema")
        res = await _repo(db_session, actor, owner, name)
        tool = await custom_tools.get(db_session, actor.principal, res, tool_id)
        await custom_tools.update(db_session, actor, res, tool, data)
        return await _read(db_session, tool)

    @get(TOOL + "/versions", summary="Every version of a tool, oldest first")
    async def list_versions(
        self,
        db_session: DbSession,
        actor: ActorDep,
        owner: FromPath[str],
        name: FromPath[str],
        tool_id: FromPath[int],
    ) -> list[ToolVersionRead]:
        res = await _repo(db_session, actor, owner, name)
        return await custom_tools.version_reads(
            db_session, await custom_tools.get(db_session, actor.principal, res, tool_id)
        )

    @post(TOOL + "/activate", summary="Offer a version to agents from now on", status_code=200)
    async def activate(
        self, db_session: DbSession, actor: ActorDep, owner: FromPath[str], name: FromPath[str], tool_id: FromPath[int],
        data: JSONBody[ActivateVersion],
    ) -> ToolRead:  # fmt: skip
        res = await _repo(db_session, actor, owner, name)
        tool = await custom_tools.get(db_session, actor.principal, res, tool_id)
        await custom_tools.activate(db_session, actor, res, tool, data.version)
        return await _read(db_session, tool)

    @post(TOOL + "/versions/{version:int}/restore", summary="An old version as a new draft", status_code=201)
    async def restore(
        self, db_session: DbSession, actor: ActorDep, owner: FromPath[str], name: FromPath[str], tool_id: FromPath[int],
        version: FromPath[int],
    ) -> ToolRead:  # fmt: skip
        res = await _repo(db_session, actor, owner, name)
        tool = await custom_tools.get(db_session, actor.principal, res, tool_id)
        await custom_tools.restore(db_session, actor, res, tool, version)
        return await _read(db_session, tool)

    @post(TOOL + "/test-run", summary="Run a version with these inputs now, without a task (admins)", status_code=200)
    async def test_run(
        self, actor: ActorDep, task_system: SystemDep, owner: FromPath[str], name: FromPath[str],
        tool_id: FromPath[int], request: Request[Any, Any, Any], data: JSONBody[TestRunRequest],
    ) -> ToolRunRead:  # fmt: skip
        await no_duplicate_keys(request, "invalid_tool_inputs")
        return await _test_run(task_system, actor, (owner, name), tool_id, data)

    @get(TOOL + "/runs", summary="A tool's runs here, newest first (test runs for admins only)")
    async def list_runs(
        self, db_session: DbSession, actor: ActorDep, owner: FromPath[str], name: FromPath[str], tool_id: FromPath[int],
        limit: FromQuery[int] = 30,
    ) -> list[ToolRunRead]:  # fmt: skip
        res = await _repo(db_session, actor, owner, name, Action.TASK_READ)
        tool = await _tool_for_runs(db_session, res, tool_id)
        runs = await tool_runs.of_tool(db_session, actor.principal, res, tool, limit=limit)
        return await tool_runs.reads(db_session, runs)

    @get(TOOL_RUN, summary="A tool run: its state, inputs, exit code and output tail")
    async def get_run(
        self, db_session: DbSession, actor: ActorDep, owner: FromPath[str], name: FromPath[str], run_id: FromPath[int]
    ) -> ToolRunRead:
        res = await _repo(db_session, actor, owner, name, Action.TASK_READ)
        [read] = await tool_runs.reads(db_session, [await tool_runs.get(db_session, actor.principal, res, run_id)])
        return read

    @post(
        TOOL_RUN + "/approve", summary="Approve a call that waits: it runs exactly these inputs, once", status_code=200
    )
    async def approve(
        self, db_session: DbSession, actor: ActorDep, task_system: SystemDep, owner: FromPath[str],
        name: FromPath[str], run_id: FromPath[int], data: JSONBody[Decision | None] = None,
    ) -> ToolRunRead:  # fmt: skip
        return await _decide(db_session, actor, task_system, owner, name, run_id, True, data)

    @post(TOOL_RUN + "/deny", summary="Deny a call that waits: it runs nothing", status_code=200)
    async def deny(
        self, db_session: DbSession, actor: ActorDep, task_system: SystemDep, owner: FromPath[str],
        name: FromPath[str], run_id: FromPath[int], data: JSONBody[Decision | None] = None,
    ) -> ToolRunRead:  # fmt: skip
        return await _decide(db_session, actor, task_system, owner, name, run_id, False, data)


async def _tool_for_runs(db: DbSession, res: RepoResource, tool_id: int) -> CustomTool:
    """A tool whose runs this repository's readers may list: its own, or an instance tool."""
    tool = await db.get(CustomTool, tool_id)
    if tool is None or (tool.repo_id is not None and tool.repo_id != res.repo.id):
        raise NotFound(f"no tool {tool_id} here", code="not_found")
    return tool


async def _decide(
    db: DbSession, actor: ActorDep, system: TaskSystem, owner: str, name: str, run_id: int, approve: bool,
    data: Decision | None,
) -> ToolRunRead:  # fmt: skip
    res = await _repo(db, actor, owner, name, Action.TASK_READ)
    run = await tool_runs.get(db, actor.principal, res, run_id)
    life = system.service(db).life
    await tool_runs.decide(life, actor, res, run, approve=approve, reason=data.reason if data else "")
    [read] = await tool_runs.reads(db, [run])
    return read


class AdminToolController(Controller):
    guards = [signed_in]
    tags = ["admin"]
    dependencies = DEPENDENCIES

    @get(ADMIN_TOOLS, summary="The instance's custom tools (instance admins)")
    async def list_tools(self, db_session: DbSession, actor: ActorDep) -> list[ToolRead]:
        return await custom_tools.reads(db_session, await custom_tools.of_scope(db_session, actor.principal, None))

    @post(ADMIN_TOOLS, summary="Create an instance tool (offered on every repository once activated)", status_code=201)
    async def create_tool(
        self, db_session: DbSession, actor: ActorDep, request: Request[Any, Any, Any], data: JSONBody[ToolCreate]
    ) -> ToolRead:
        await no_duplicate_keys(request, "invalid_tool_schema")
        return await _read(db_session, await custom_tools.create(db_session, actor, None, data))

    @get(ADMIN_TOOL, summary="An instance tool")
    async def get_tool(self, db_session: DbSession, actor: ActorDep, tool_id: FromPath[int]) -> ToolRead:
        return await _read(db_session, await custom_tools.get(db_session, actor.principal, None, tool_id))

    @patch(ADMIN_TOOL, summary="Change an instance tool (a new draft version), or switch it on or off")
    async def update_tool(
        self,
        db_session: DbSession,
        actor: ActorDep,
        tool_id: FromPath[int],
        request: Request[Any, Any, Any],
        data: JSONBody[ToolUpdate],
    ) -> ToolRead:
        await no_duplicate_keys(request, "invalid_tool_schema")
        tool = await custom_tools.get(db_session, actor.principal, None, tool_id)
        await custom_tools.update(db_session, actor, None, tool, data)
        return await _read(db_session, tool)

    @get(ADMIN_TOOL + "/versions", summary="Every version of an instance tool")
    async def list_versions(
        self, db_session: DbSession, actor: ActorDep, tool_id: FromPath[int]
    ) -> list[ToolVersionRead]:
        return await custom_tools.version_reads(
            db_session, await custom_tools.get(db_session, actor.principal, None, tool_id)
        )

    @post(ADMIN_TOOL + "/activate", summary="Offer a version to agents from now on", status_code=200)
    async def activate(
        self, db_session: DbSession, actor: ActorDep, tool_id: FromPath[int], data: JSONBody[ActivateVersion]
    ) -> ToolRead:
        tool = await custom_tools.get(db_session, actor.principal, None, tool_id)
        await custom_tools.activate(db_session, actor, None, tool, data.version)
        return await _read(db_session, tool)

    @post(ADMIN_TOOL + "/versions/{version:int}/restore", summary="An old version as a new draft", status_code=201)
    async def restore(
        self, db_session: DbSession, actor: ActorDep, tool_id: FromPath[int], version: FromPath[int]
    ) -> ToolRead:
        tool = await custom_tools.get(db_session, actor.principal, None, tool_id)
        await custom_tools.restore(db_session, actor, None, tool, version)
        return await _read(db_session, tool)

    @post(ADMIN_TOOL + "/test-run", summary="Run a version of an instance tool now, without a task", status_code=200)
    async def test_run(
        self,
        actor: ActorDep,
        task_system: SystemDep,
        tool_id: FromPath[int],
        request: Request[Any, Any, Any],
        data: JSONBody[TestRunRequest],
    ) -> ToolRunRead:
        await no_duplicate_keys(request, "invalid_tool_inputs")
        return await _test_run(task_system, actor, None, tool_id, data)

    @get(ADMIN_TOOL + "/runs", summary="An instance tool's runs on every repository, newest first")
    async def list_runs(
        self, db_session: DbSession, actor: ActorDep, tool_id: FromPath[int], limit: FromQuery[int] = 30
    ) -> list[ToolRunRead]:
        tool = await custom_tools.get(db_session, actor.principal, None, tool_id)
        return await tool_runs.reads(
            db_session, await tool_runs.of_tool(db_session, actor.principal, None, tool, limit=limit)
        )
