"""The custom tool pages' routes (docs/tools.md): a repository's tools under its settings
(`/{owner}/{name}/settings/tools`, its admins) and the instance's in the admin area (`/admin/tools`,
instance admins). Each route hands over to the views of `tasks.http.pages.tools`, the same for both
places: the handlers are written once (`ToolPages`), and each place's controller provides the
`place` they act on."""

from typing import Any

from litestar import Controller, Request, get, post
from litestar.di import NamedDependency, Provide
from litestar.params import FromPath, FromQuery, URLEncodedBody
from litestar.response import Redirect, Template

from forge.http.deps import ActorDep
from forge.http.pages.common import instance_admin
from tasks.http.pages.tool_forms import EnableForm, SchemaCheck, SchemaCheckForm, TestRunForm, ToolForm, VersionForm
from tasks.http.pages.tools import (
    ADMIN_PATH,
    REPO_PATH,
    Number,
    Place,
    activate_version,
    check_schema_text,
    create_tool,
    form_view,
    list_view,
    new_version,
    notice_of,
    restore_version,
    run_test,
    switch_tool,
    tool_view,
)

PlaceDep = NamedDependency[Place]

# --- the routes ---------------------------------------------------------------------------------


class ToolPages(Controller):
    """The tool pages of one place (`place`, a dependency each subclass provides)."""

    include_in_schema = False

    @get("/")
    async def tools(self, request: Request[Any, Any, Any], actor: ActorDep, place: PlaceDep) -> Template:
        return await list_view(request, actor, place)

    @get("/new")
    async def new_tool(self, request: Request[Any, Any, Any], actor: ActorDep, place: PlaceDep) -> Template:
        return await form_view(request, actor, place)

    @post("/")
    async def create(
        self, request: Request[Any, Any, Any], actor: ActorDep, place: PlaceDep, data: URLEncodedBody[ToolForm]
    ) -> Template | Redirect:
        return await create_tool(request, actor, place, data)

    @post("/check-schema", status_code=200)
    async def check_schema(
        self, request: Request[Any, Any, Any], actor: ActorDep, place: PlaceDep, data: URLEncodedBody[SchemaCheckForm]
    ) -> SchemaCheck:
        return await check_schema_text(request, actor, place, data)

    @get("/{tool_id:int}")
    async def tool(
        self, request: Request[Any, Any, Any], actor: ActorDep, place: PlaceDep, tool_id: FromPath[int],
        old: Number = None, new: Number = None, run: Number = None, done: FromQuery[str | None] = None,
        v: Number = None, src: Number = None,
    ) -> Template:  # fmt: skip
        notice = notice_of(done, v, src)
        return await tool_view(request, actor, place, tool_id, old=old, new=new, shown_run=run, notice=notice)

    @get("/{tool_id:int}/edit")
    async def edit(
        self, request: Request[Any, Any, Any], actor: ActorDep, place: PlaceDep, tool_id: FromPath[int]
    ) -> Template:
        return await form_view(request, actor, place, tool_id)

    @post("/{tool_id:int}/edit")
    async def change(
        self, request: Request[Any, Any, Any], actor: ActorDep, place: PlaceDep, tool_id: FromPath[int],
        data: URLEncodedBody[ToolForm],
    ) -> Template | Redirect:  # fmt: skip
        return await new_version(request, actor, place, tool_id, data)

    @post("/{tool_id:int}/activate")
    async def activate(
        self, request: Request[Any, Any, Any], actor: ActorDep, place: PlaceDep, tool_id: FromPath[int],
        data: URLEncodedBody[VersionForm],
    ) -> Redirect:  # fmt: skip
        return await activate_version(request, actor, place, tool_id, data)

    @post("/{tool_id:int}/restore")
    async def restore(
        self, request: Request[Any, Any, Any], actor: ActorDep, place: PlaceDep, tool_id: FromPath[int],
        data: URLEncodedBody[VersionForm],
    ) -> Redirect:  # fmt: skip
        return await restore_version(request, actor, place, tool_id, data)

    @post("/{tool_id:int}/enabled")
    async def switch(
        self, request: Request[Any, Any, Any], actor: ActorDep, place: PlaceDep, tool_id: FromPath[int],
        data: URLEncodedBody[EnableForm],
    ) -> Redirect:  # fmt: skip
        return await switch_tool(request, actor, place, tool_id, data)

    @post("/{tool_id:int}/test-run")
    async def test_run(
        self, request: Request[Any, Any, Any], actor: ActorDep, place: PlaceDep, tool_id: FromPath[int],
        data: URLEncodedBody[TestRunForm],
    ) -> Template | Redirect:  # fmt: skip
        return await run_test(request, actor, place, tool_id, data)


def repository_place(owner: FromPath[str], name: FromPath[str]) -> Place:
    return Place(owner, name)


def instance_place() -> Place:
    return Place()


class RepoToolPages(ToolPages):
    """A repository's tools, under its settings (its admins)."""

    path = REPO_PATH
    dependencies = {"place": Provide(repository_place, sync_to_thread=False)}


class AdminToolPages(ToolPages):
    """The instance's tools, in the admin area (instance admins). A page of tasks, not of forge
    (forge imports nothing of tasks): the admin nav links here by its path."""

    path = ADMIN_PATH
    guards = [instance_admin]
    dependencies = {"place": Provide(instance_place, sync_to_thread=False)}
