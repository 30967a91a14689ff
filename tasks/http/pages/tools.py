"""Custom tools in the browser (docs/tools.md): a repository's under its settings
(`/{owner}/{name}/settings/tools`, its admins) and the instance's under the admin area
(`/admin/tools`, instance admins). The list (with what an agent on the repository is offered of
the instance's tools), the form that makes a tool or a new draft version of it (the parameter
schema checked as it is typed, through `.../check-schema`), and a tool's page: its versions
(activate, restore), the diff between two of them, switching it on or off, a test run and the run
history. Same services as `/api/v1/.../tools`; a refused form comes back as typed, the refusal
beside the field it concerns. Forms work without script (POST, then a redirect to the page)."""

from dataclasses import dataclass
from typing import Annotated, Any

from litestar import Request
from litestar.params import QueryParameter
from litestar.response import Redirect, Template
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from forge.core.access import Action
from forge.core.errors import ForgeError
from forge.db.audit import Actor
from forge.db.models import Repository
from forge.http.pages.common import or_form_error, page
from forge.http.pages.forms import NO_ERRORS, FormErrors, form_errors
from forge.repos import repositories
from forge.repos.repositories import RepoResource
from tasks.core.custom_tool_schemas import INTERPRETER_NAMES, MODES, ToolRunRead, ToolUpdate
from tasks.core.tool_models import CustomToolRun
from tasks.http.deps import task_system
from tasks.http.pages import tool_forms
from tasks.http.pages.common import repo_context
from tasks.http.pages.tool_cards import Text
from tasks.http.pages.tool_forms import (
    EnableForm,
    SchemaCheck,
    SchemaCheckForm,
    TestRunForm,
    ToolForm,
    VersionForm,
)
from tasks.run.tool_trial import trial_run
from tasks.services import custom_tools, tool_runs
from tasks.system import TaskSystem

REPO_PATH = "/{owner:str}/{name:str}/settings/tools"
ADMIN_PATH = "/admin/tools"
# What a redirect after a change tells the person (`?done=...&v=N`); nothing else is shown.
NOTICES = {
    "created": "Tool created. Version 1 is a draft: activate it to offer it to agents.",
    "version": "Version {v} made, a draft: activate it to offer it to agents.",
    "unchanged": "Nothing changed: no new version was made.",
    "activated": "Version {v} is active: agents are offered it from now on.",
    "restored": "Version {v} restores version {src}, as a draft: activate it to offer it to agents.",
    "enabled": "The tool is enabled: agents are offered its active version.",
    "disabled": "The tool is disabled: agents are not offered it.",
}
Number = Annotated[int | None, QueryParameter(ge=1, le=1_000_000_000)]


@dataclass(frozen=True)
class Place:
    """Whose tools a page is about: a repository's (`owner`/`name`), or the instance's (None)."""

    owner: str | None = None
    name: str | None = None

    @property
    def base(self) -> str:
        return ADMIN_PATH if self.owner is None else f"/{self.owner}/{self.name}/settings/tools"

    async def load(self, s: AsyncSession, actor: Actor) -> RepoResource | None:
        """The repository, for its admins (404 or 403 below, as `repositories.load` answers)."""
        if self.owner is None or self.name is None:
            return None
        return await repositories.load(s, actor.principal, self.owner, self.name, Action.REPO_ADMIN)


@dataclass
class RunRow:
    """A run as the history shows it: where it came from (a task's page, or a test run)."""

    read: ToolRunRead
    task_url: str
    tail: Text
    shown: bool  # the run a test run just made: open, and the page jumps to it


def _system(request: Request[Any, Any, Any]) -> TaskSystem:
    return task_system(request.app.state)


def _frame(request: Request[Any, Any, Any], res: RepoResource | None, actor: Actor, place: Place) -> dict[str, Any]:
    """What every tool page shows around itself: the repository's settings or the admin area."""
    out: dict[str, Any] = {"tools_base": place.base, "scope_repo": res is not None}
    if res is not None:
        out.update(repo_context(res, actor.principal, _system(request).settings.effective_base_url))
        out["settings_section"] = "tools"
    else:
        out["admin_section"] = "tools"
    return out


def notice_of(done: str | None, v: int | None, src: int | None) -> str | None:
    text = NOTICES.get(done or "")
    return text.format(v=v or "?", src=src or "?") if text else None


# --- what the pages show ------------------------------------------------------------------------


async def list_view(request: Request[Any, Any, Any], actor: Actor, place: Place) -> Template:
    async with _system(request).db.session() as s:
        res = await place.load(s, actor)
        tools = await custom_tools.reads(s, await custom_tools.of_scope(s, actor.principal, res))
        offered = await custom_tools.for_agents(s, actor.principal, res) if res is not None else []
    return page(
        request,
        "tasks/tools.html",
        tools=tools,
        # The instance's tools an agent here is offered, and those a tool of this repository shadows.
        instance_tools=[t for t in offered if t.scope == "instance"],
        shadowed=[t for t in offered if t.shadows_instance_tool],
        **_frame(request, res, actor, place),
    )


async def form_view(
    request: Request[Any, Any, Any],
    actor: Actor,
    place: Place,
    tool_id: int | None = None,
    *,
    form: ToolForm | None = None,
    errors: FormErrors = NO_ERRORS,
    status_code: int = 200,
) -> Template:
    """The form that makes a tool (`tool_id` None) or a new version of one (from its latest)."""
    async with _system(request).db.session() as s:
        res = await place.load(s, actor)
        tool = None
        if tool_id is not None:
            [tool] = await custom_tools.reads(s, [await custom_tools.get(s, actor.principal, res, tool_id)])
        else:
            custom_tools.require_admin(actor.principal, res)
    return page(
        request,
        "tasks/tool_form.html",
        status_code,
        tool=tool,
        form=form or (tool_forms.form_of(tool.latest) if tool is not None else ToolForm()),
        errors=errors,
        interpreters=INTERPRETER_NAMES,
        modes=MODES,
        **_frame(request, res, actor, place),
    )


async def tool_view(
    request: Request[Any, Any, Any],
    actor: Actor,
    place: Place,
    tool_id: int,
    *,
    old: int | None = None,
    new: int | None = None,
    shown_run: int | None = None,
    notice: str | None = None,
    test_form: TestRunForm | None = None,
    test_errors: FormErrors = NO_ERRORS,
    status_code: int = 200,
) -> Template:
    """A tool's page: its versions, a diff between two, switching, a test run, its runs."""
    async with _system(request).db.session() as s:
        res = await place.load(s, actor)
        row = await custom_tools.get(s, actor.principal, res, tool_id)
        [tool] = await custom_tools.reads(s, [row])
        versions = await custom_tools.version_reads(s, row)
        runs = await tool_runs.of_tool(s, actor.principal, res, row)
        rows = await _run_rows(s, runs, await tool_runs.reads(s, runs), shown_run)
    chosen = tool.active or tool.latest
    return page(
        request,
        "tasks/tool.html",
        status_code,
        tool=tool,
        versions=list(reversed(versions)),  # newest first
        version_numbers=[v.version for v in versions],
        diff=tool_forms.choose_diff(versions, old, new),
        runs=rows,
        notice=notice,
        test_form=test_form or TestRunForm(inputs=tool_forms.inputs_skeleton(chosen.parameters)),
        test_errors=test_errors,
        **_frame(request, res, actor, place),
    )


async def _run_rows(
    s: AsyncSession, runs: list[CustomToolRun], reads: list[ToolRunRead], shown: int | None
) -> list[RunRow]:
    """Each run with the link to its task (an instance tool's runs are on many repositories)."""
    repo_ids = {r.repo_id for r in runs if r.repo_id is not None and r.task_id is not None}
    found = (await s.scalars(select(Repository).where(Repository.id.in_(repo_ids)))).all() if repo_ids else []
    names = {r.id: f"{r.owner.login}/{r.name}" for r in found}
    out: list[RunRow] = []
    for run, read in zip(runs, reads, strict=True):
        where = names.get(run.repo_id) if run.repo_id is not None else None
        url = f"/{where}/tasks/{read.task}" if where and read.task is not None else ""
        out.append(RunRow(read=read, task_url=url, tail=tool_forms.output_tail(read.output), shown=read.id == shown))
    return out


# --- what the forms do --------------------------------------------------------------------------


async def create_tool(
    request: Request[Any, Any, Any], actor: Actor, place: Place, data: ToolForm
) -> Template | Redirect:
    async def save() -> int:
        change = tool_forms.tool_create(data)
        async with _system(request).db.session(write=True) as s:
            res = await place.load(s, actor)
            return (await custom_tools.create(s, actor, res, change)).id

    async def again(exc: ForgeError) -> Template:
        errors = tool_forms.errors_of(exc)
        return await form_view(request, actor, place, form=data, errors=errors, status_code=exc.status)

    made = await or_form_error(save(), again)
    if isinstance(made, Template):
        return made
    return Redirect(f"{place.base}/{made}?done=created", status_code=303)


async def new_version(
    request: Request[Any, Any, Any], actor: Actor, place: Place, tool_id: int, data: ToolForm
) -> Template | Redirect:
    """A new draft version from the form (none when it says what the latest version says)."""

    async def save() -> int | None:
        update = tool_forms.tool_update(data)
        async with _system(request).db.session(write=True) as s:
            res = await place.load(s, actor)
            tool = await custom_tools.get(s, actor.principal, res, tool_id)
            [read] = await custom_tools.reads(s, [tool])
            if tool_forms.unchanged(update, read.latest):
                return None
            await custom_tools.update(s, actor, res, tool, update)
            return tool.last_version

    async def again(exc: ForgeError) -> Template:
        errors = tool_forms.errors_of(exc)
        return await form_view(request, actor, place, tool_id, form=data, errors=errors, status_code=exc.status)

    made = await or_form_error(save(), again)
    if isinstance(made, Template):
        return made
    done = "unchanged" if made is None else f"version&v={made}"
    return Redirect(f"{place.base}/{tool_id}?done={done}", status_code=303)


async def activate_version(
    request: Request[Any, Any, Any], actor: Actor, place: Place, tool_id: int, data: VersionForm
) -> Redirect:
    number = tool_forms.version_number(data.version) or 0
    async with _system(request).db.session(write=True) as s:
        res = await place.load(s, actor)
        await custom_tools.activate(s, actor, res, await custom_tools.get(s, actor.principal, res, tool_id), number)
    return Redirect(f"{place.base}/{tool_id}?done=activated&v={number}", status_code=303)


async def restore_version(
    request: Request[Any, Any, Any], actor: Actor, place: Place, tool_id: int, data: VersionForm
) -> Redirect:
    number = tool_forms.version_number(data.version) or 0
    async with _system(request).db.session(write=True) as s:
        res = await place.load(s, actor)
        tool = await custom_tools.get(s, actor.principal, res, tool_id)
        made = await custom_tools.restore(s, actor, res, tool, number)
    return Redirect(f"{place.base}/{tool_id}?done=restored&v={made}&src={number}", status_code=303)


async def switch_tool(
    request: Request[Any, Any, Any], actor: Actor, place: Place, tool_id: int, data: EnableForm
) -> Redirect:
    on = bool(data.enabled)
    async with _system(request).db.session(write=True) as s:
        res = await place.load(s, actor)
        tool = await custom_tools.get(s, actor.principal, res, tool_id)
        await custom_tools.update(s, actor, res, tool, ToolUpdate(enabled=on))
    return Redirect(f"{place.base}/{tool_id}?done={'enabled' if on else 'disabled'}", status_code=303)


async def run_test(
    request: Request[Any, Any, Any], actor: Actor, place: Place, tool_id: int, data: TestRunForm
) -> Template | Redirect:
    """Run a version now (`tasks.run.tool_trial`), then show the run on the tool's page. No
    session is held across the run (it may take minutes): the checks read in one of their own,
    the run records itself."""
    system = _system(request)

    async def run() -> int:
        inputs = tool_forms.run_inputs(data.inputs)
        async with system.db.session() as s:
            res = await place.load(s, actor)
            tool = await custom_tools.get(s, actor.principal, res, tool_id)
            number = tool_forms.version_number(data.version) or tool.active_version or tool.last_version
            version = await custom_tools.version(s, tool, number)
        engine = system.worker.engine if system.worker is not None else None
        return await trial_run(system.db, system.store, system.settings, actor, tool, version, inputs, engine=engine)

    async def again(exc: ForgeError) -> Template:
        errors = form_errors(exc, ("inputs", "version"), {"invalid_tool_inputs": "inputs", "not_found": "version"})
        return await tool_view(
            request, actor, place, tool_id, test_form=data, test_errors=errors, status_code=exc.status
        )

    ran = await or_form_error(run(), again)
    if isinstance(ran, Template):
        return ran
    return Redirect(f"{place.base}/{tool_id}?run={ran}#run-{ran}", status_code=303)


async def check_schema_text(
    request: Request[Any, Any, Any], actor: Actor, place: Place, data: SchemaCheckForm
) -> SchemaCheck:
    """The live check of a parameter schema as typed: for the scope's admins, like the form."""
    async with _system(request).db.session() as s:
        custom_tools.require_admin(actor.principal, await place.load(s, actor))
    return tool_forms.check_schema(data.parameters)
