"""Settings > Schedules (repository admins): the repository's schedules with their next run and
what their last slot did, a form to add one, and each schedule's page to change, pause, resume
or delete it. Same service as `.../schedules` over REST; a refused form comes back as typed,
the refusal beside the field it concerns."""

from typing import Any, TypeVar

import msgspec
from litestar import Controller, Request, get, post
from litestar.params import FromPath, URLEncodedBody
from litestar.response import Redirect, Template

from forge.core.access import Action
from forge.core.errors import ForgeError
from forge.db.audit import Actor
from forge.db.engine import Database
from forge.http.deps import ActorDep, DatabaseDep
from forge.http.pages.common import page
from forge.http.pages.forms import NO_ERRORS, FormErrors, form_errors, invalid_input
from forge.repos import repositories
from tasks.core.schedule_schemas import ScheduleCreate, ScheduleRead, ScheduleUpdate
from tasks.http.pages.common import or_form_error, repo_context
from tasks.services import agents
from tasks.system import TaskSystem

T = TypeVar("T")
RUNTIMES = ("builtin", "command", "claude-code", "codex", "acp")
# What a refusal can name (a wire path or an error code) -> the form's input.
ALIASES = {
    "invalid_cron": "cron",
    "unknown_timezone": "timezone",
    "schedule_exists": "name",
    "invalid_agent": "agent",
    "command_required": "command",
    "invalid_command": "command",
    "base_not_found": "base",
    "goal_required": "goal",
    "agent_command_required": "agent_command",
    "unknown_acp_agent": "agent_command",
    "invalid_agent_command": "agent_command",
    "model_not_configured": "runtime",
    "model_not_chosen": "runtime",
}


class ScheduleForm(msgspec.Struct, kw_only=True):
    name: str = ""
    cron: str = ""
    timezone: str = "UTC"
    goal: str = ""
    agent: str = ""
    runtime: str = "builtin"
    command: str = ""
    agent_command: str = ""
    base: str = ""
    title: str = ""
    paused: str = ""
    csrf_token: str = ""


INPUTS = ScheduleForm.__struct_fields__


def form_of(read: ScheduleRead) -> ScheduleForm:
    command = read.command if isinstance(read.command, str) else " ".join(read.command or [])
    return ScheduleForm(
        name=read.name,
        cron=read.cron,
        timezone=read.timezone,
        goal=read.goal,
        agent=read.agent or "",
        runtime=read.runtime,
        command=command,
        agent_command=read.agent_command or "",
        base=read.base,
        title=read.title,
        paused="1" if read.paused else "",
    )


def body_of(form: ScheduleForm) -> dict[str, Any]:
    """The form as the REST body would say it (blank command and ACP agent: none)."""
    return {
        "name": form.name,
        "cron": form.cron,
        "timezone": form.timezone.strip() or "UTC",
        "goal": form.goal,
        "agent": form.agent,
        "runtime": form.runtime or None,
        "command": form.command if form.command.strip() else None,
        "agent_command": form.agent_command.strip() or None,
        "base": form.base,
        "title": form.title,
        "paused": bool(form.paused),
    }


def parsed(body: dict[str, Any], shape: type[T]) -> T:
    try:
        return msgspec.convert(body, shape)
    except msgspec.ValidationError as exc:
        raise invalid_input(exc) from None


class SchedulePages(Controller):
    path = "/{owner:str}/{name:str}/settings/schedules"
    include_in_schema = False

    async def _render(
        self,
        request: Request[Any, Any, Any],
        db: Database,
        actor: Actor,
        owner: str,
        name: str,
        *,
        schedule_id: int | None = None,
        form: ScheduleForm | None = None,
        errors: FormErrors = NO_ERRORS,
        status_code: int = 200,
        notice: str | None = None,
    ) -> Template:
        system: TaskSystem = request.app.state.tasks
        async with db.session() as s:
            res = await repositories.load(s, actor.principal, owner, name, Action.REPO_ADMIN)
            schedules = system.schedules(s)
            if schedule_id is None:
                current, listed = None, await schedules.reads(res, await schedules.of_repo(actor.principal, res))
            else:
                [current] = await schedules.reads(res, [await schedules.get(actor.principal, res, schedule_id)])
                listed = []
            bots = await agents.eligible_agents(s, res)
            context = repo_context(res, actor.principal, system.settings.effective_base_url)
        return page(
            request,
            "tasks/schedules.html",
            status_code,
            schedules=listed,
            current=current,
            form=form or (form_of(current) if current is not None else ScheduleForm()),
            errors=errors,
            bots=bots,
            runtimes=RUNTIMES,
            notice=notice,
            **context,
        )

    @get("/")
    async def list_page(
        self,
        request: Request[Any, Any, Any],
        db: DatabaseDep,
        actor: ActorDep,
        owner: FromPath[str],
        name: FromPath[str],
    ) -> Template:
        return await self._render(request, db, actor, owner, name)

    @get("/{schedule_id:int}")
    async def schedule_page(
        self,
        request: Request[Any, Any, Any],
        db: DatabaseDep,
        actor: ActorDep,
        owner: FromPath[str],
        name: FromPath[str],
        schedule_id: FromPath[int],
    ) -> Template:
        return await self._render(request, db, actor, owner, name, schedule_id=schedule_id)

    @post("/")
    async def create(
        self,
        request: Request[Any, Any, Any],
        db: DatabaseDep,
        actor: ActorDep,
        owner: FromPath[str],
        name: FromPath[str],
        data: URLEncodedBody[ScheduleForm],
    ) -> Template | Redirect:
        system: TaskSystem = request.app.state.tasks

        async def save() -> int:
            change = parsed(body_of(data), ScheduleCreate)
            async with db.session(write=True) as s:
                res = await repositories.load(s, actor.principal, owner, name, Action.REPO_ADMIN)
                return (await system.schedules(s).create(actor, res, change)).id

        async def again(exc: ForgeError) -> Template:
            errors = form_errors(exc, INPUTS, ALIASES)
            return await self._render(request, db, actor, owner, name, form=data, errors=errors, status_code=exc.status)

        saved = await or_form_error(save(), again)
        if isinstance(saved, Template):
            return saved
        return Redirect(f"/{owner}/{name}/settings/schedules/{saved}")

    @post("/{schedule_id:int}")
    async def update(
        self,
        request: Request[Any, Any, Any],
        db: DatabaseDep,
        actor: ActorDep,
        owner: FromPath[str],
        name: FromPath[str],
        schedule_id: FromPath[int],
        data: URLEncodedBody[ScheduleForm],
    ) -> Template:
        system: TaskSystem = request.app.state.tasks

        async def save() -> None:
            change = parsed(body_of(data), ScheduleUpdate)
            async with db.session(write=True) as s:
                res = await repositories.load(s, actor.principal, owner, name, Action.REPO_ADMIN)
                schedules = system.schedules(s)
                await schedules.update(actor, res, await schedules.get(actor.principal, res, schedule_id), change)

        async def again(exc: ForgeError) -> Template:
            errors = form_errors(exc, INPUTS, ALIASES)
            return await self._render(
                request, db, actor, owner, name, schedule_id=schedule_id, form=data, errors=errors,
                status_code=exc.status,
            )  # fmt: skip

        refused = await or_form_error(save(), again)
        if isinstance(refused, Template):
            return refused
        return await self._render(request, db, actor, owner, name, schedule_id=schedule_id, notice="Saved.")

    @post("/{schedule_id:int}/delete")
    async def delete(
        self,
        request: Request[Any, Any, Any],
        db: DatabaseDep,
        actor: ActorDep,
        owner: FromPath[str],
        name: FromPath[str],
        schedule_id: FromPath[int],
    ) -> Redirect:
        system: TaskSystem = request.app.state.tasks
        async with db.session(write=True) as s:
            res = await repositories.load(s, actor.principal, owner, name, Action.REPO_ADMIN)
            schedules = system.schedules(s)
            await schedules.delete(actor, res, await schedules.get(actor.principal, res, schedule_id))
        return Redirect(f"/{owner}/{name}/settings/schedules/")
