"""The repository's task settings in the browser (repository admins): the model endpoint, the
watchdog limits, the merge rules and network access (egress), over the instance's defaults. Same service as
`PUT .../task-settings`; the model key is write-only (never shown, kept unless replaced). The
Environment section declares, removes, rebuilds and checks the environment (same services as
`.../environment` and `.../environment/check`)."""

from typing import Annotated, Any

import msgspec
from litestar import Controller, Request, get, post
from litestar.params import FromPath, QueryParameter, URLEncodedBody
from litestar.response import Redirect, Template

from egress import PRESETS
from forge.core.access import Action
from forge.core.errors import ForgeError, InvalidInput, NotFound
from forge.http.deps import ActorDep, DatabaseDep, SettingsDep
from forge.http.pages.common import WebForm, page
from forge.http.pages.forms import NO_ERRORS, FormErrors, form_errors, invalid_input
from forge.repos import repositories
from tasks.core import repo_settings as core_settings
from tasks.core.models import RepoTaskSettings
from tasks.http.actions import check_task, start_task
from tasks.http.deps import RepoScopeDep
from tasks.http.pages.common import PAGE_DEPENDENCIES, or_form_error, repo_context
from tasks.services import agents, environment_check, repo_settings
from tasks.services.environment_check import EnvironmentCheckRead
from tasks.services.repo_settings import RepoTaskSettingsRead

INT_FIELDS = (
    "turn_limit",
    "tool_timeout_seconds",
    "idle_seconds",
    "wall_clock_seconds",
    "token_budget",
    "required_approvals",
    "max_subtask_depth",
    "max_subtasks",
)


class TaskSettingsForm(msgspec.Struct, kw_only=True):
    model_base_url: str = ""
    model_name: str = ""
    model_api_key: str = ""
    remove_model_api_key: str = ""
    anthropic_base_url: str = ""
    anthropic_model: str = ""
    anthropic_api_key: str = ""
    remove_anthropic_api_key: str = ""
    allow_personal_keys: str = ""
    allow_web_search: str = ""
    turn_limit: str = ""
    tool_timeout_seconds: str = ""
    idle_seconds: str = ""
    wall_clock_seconds: str = ""
    token_budget: str = ""
    required_approvals: str = ""
    approval_not_by_starter: str = ""
    delete_branch_on_merge: str = ""
    review_agents_may_approve: str = ""
    trigger_runtime: str = ""  # blank: builtin
    egress_mode: str = "off"
    egress_rules: str = ""  # one rule per line
    egress_preset_pypi: str = ""
    egress_preset_npm: str = ""
    egress_preset_debian: str = ""
    max_subtask_depth: str = ""
    max_subtasks: str = ""
    subtask_runtimes: str = ""  # comma- or space-separated
    worker_labels: str = ""  # comma- or space-separated
    csrf_token: str = ""


# What a refusal can name (a wire path or an error code) -> the form's input.
ALIASES = {
    "egress.rules": "egress_rules",
    "invalid_egress_rule": "egress_rules",
    "egress.presets": "egress_presets",
    "invalid_egress_preset": "egress_presets",
    "egress.mode": "egress_mode",
    "invalid_worker_labels": "worker_labels",
}
INPUTS = (*TaskSettingsForm.__struct_fields__, "egress_presets")


def _text(value: object) -> str:
    return "" if value is None else str(value)


def settings_form(read: RepoTaskSettingsRead) -> TaskSettingsForm:
    """The stored settings as the form shows them (blank: the instance's default)."""
    values: dict[str, str] = {name: _text(getattr(read, name)) for name in INT_FIELDS}
    for name in ("model_base_url", "model_name", "anthropic_base_url", "anthropic_model", "trigger_runtime"):
        values[name] = _text(getattr(read, name))
    checks = ("approval_not_by_starter", "delete_branch_on_merge", "review_agents_may_approve", "allow_personal_keys")
    for name in (*checks, "allow_web_search"):
        values[name] = "1" if getattr(read, name) else ""
    for name in PRESETS:
        values[f"egress_preset_{name}"] = "1" if name in read.egress.presets else ""
    return TaskSettingsForm(
        **values,
        egress_mode=read.egress.mode,
        egress_rules="\n".join(read.egress.rules),
        subtask_runtimes=", ".join(read.subtask_runtimes or []),
        worker_labels=", ".join(read.worker_labels or []),
    )


def settings_update(form: TaskSettingsForm) -> repo_settings.RepoTaskSettingsUpdate:
    """Blank means "the instance's default"; bad numbers are refused like the REST body would be."""
    values: dict[str, Any] = {
        "model_base_url": form.model_base_url.strip()[:500] or None,
        "model_name": form.model_name.strip()[:200] or None,
        "approval_not_by_starter": bool(form.approval_not_by_starter),
        "delete_branch_on_merge": bool(form.delete_branch_on_merge),
        "review_agents_may_approve": bool(form.review_agents_may_approve),
        "trigger_runtime": form.trigger_runtime.strip() or None,
        "anthropic_base_url": form.anthropic_base_url.strip()[:500] or None,
        "anthropic_model": form.anthropic_model.strip()[:200] or None,
        "allow_personal_keys": bool(form.allow_personal_keys),
        "allow_web_search": bool(form.allow_web_search),
        "subtask_runtimes": form.subtask_runtimes.replace(",", " ").split() or None,
        "worker_labels": [label[:64] for label in form.worker_labels.replace(",", " ").split()[:64]] or None,
        "egress": {
            "mode": form.egress_mode,
            "rules": [line.strip() for line in form.egress_rules.splitlines() if line.strip()],
            "presets": [name for name in PRESETS if getattr(form, f"egress_preset_{name}")],
        },
    }
    for key, remove in (
        ("model_api_key", form.remove_model_api_key),
        ("anthropic_api_key", form.remove_anthropic_api_key),
    ):
        if remove:
            values[key] = ""
        elif getattr(form, key):
            values[key] = getattr(form, key)[:4096]
    for name in INT_FIELDS:
        raw = getattr(form, name).strip()
        if raw:
            if not (raw.isascii() and raw.isdigit()) or len(raw) > 10:
                raise InvalidInput(f"{name.replace('_', ' ')}: a whole number, or blank for the default", field=name)
            values[name] = int(raw)
    try:
        return msgspec.convert(values, repo_settings.RepoTaskSettingsUpdate)
    except msgspec.ValidationError as exc:
        raise invalid_input(exc) from None


async def render_settings(
    request: Request[Any, Any, Any],
    db: Any,
    actor: Any,
    owner: str,
    name: str,
    *,
    form: TaskSettingsForm | None = None,
    errors: FormErrors = NO_ERRORS,
    check_number: int | None = None,
    **extra: Any,
) -> Template:
    async with db.session() as s:
        res = await repositories.load(s, actor.principal, owner, name, Action.REPO_ADMIN)
        row = await s.get(RepoTaskSettings, res.repo.id)
        current = repo_settings.settings_read(row)
        environment = repo_settings.environment_read(row)
        context = repo_context(res, actor.principal, request.app.state.settings.effective_base_url)
        bots = await agents.eligible_agents(s, res)
        warning = agents.self_merge_warning(bots, await core_settings.merge_rules(s, res.repo.id))
        check = await _check_or_none(s, res, check_number)
    return page(
        request,
        "tasks/settings.html",
        current=current,
        form=form or settings_form(current),
        errors=errors,
        merge_warning=warning,
        egress_presets={name: ", ".join(hosts) for name, hosts in PRESETS.items()},
        operator_presets=request.app.state.settings.egress_presets,
        environment=environment,
        check=check,
        check_agents=bots,
        **{
            "env_error": "",
            "env_typed": None,
            "check_form": EnvironmentCheckForm(command=check.command if check else ""),
            "check_errors": NO_ERRORS,
            **context,
            **extra,
        },
    )


async def _check_or_none(s: Any, res: Any, number: int | None) -> EnvironmentCheckRead | None:
    """The check a "Check environment" started (`?check=N`); none when N is no check of this repository."""
    if number is None:
        return None
    try:
        return await environment_check.read(s, res, number)
    except NotFound:
        return None


class TaskSettingsPages(Controller):
    path = "/{owner:str}/{name:str}/settings/tasks"
    include_in_schema = False

    @get("/")
    async def settings_page(
        self,
        request: Request[Any, Any, Any],
        db: DatabaseDep,
        actor: ActorDep,
        owner: FromPath[str],
        name: FromPath[str],
        check: Annotated[int | None, QueryParameter(name="check", ge=1, le=1_000_000_000)] = None,
    ) -> Template:
        # `?check=N`: the outcome of the environment check N (what "Check environment" redirects to).
        return await render_settings(request, db, actor, owner, name, notice=None, check_number=check)

    @post("/")
    async def save(
        self,
        request: Request[Any, Any, Any],
        db: DatabaseDep,
        actor: ActorDep,
        settings: SettingsDep,
        owner: FromPath[str],
        name: FromPath[str],
        data: URLEncodedBody[TaskSettingsForm],
    ) -> Template | Redirect:

        async def save() -> RepoTaskSettingsRead:
            change = settings_update(data)
            async with db.session(write=True) as s:
                res = await repositories.load(s, actor.principal, owner, name, Action.REPO_ADMIN)
                return await repo_settings.update(s, settings, actor, res, change)

        async def again(exc: ForgeError) -> Template:
            # Shown again as typed, the refusal beside the field it concerns.
            errors = form_errors(exc, INPUTS, ALIASES)
            return await render_settings(
                request, db, actor, owner, name, form=data, errors=errors, notice=None, status_code=exc.status
            )

        saved = await or_form_error(save(), again)
        if isinstance(saved, Template):
            return saved
        return await render_settings(request, db, actor, owner, name, notice="Saved.")


class EnvironmentForm(msgspec.Struct, kw_only=True):
    action: str = "save"  # save, remove or rebuild
    declaration: str = ""


class EnvironmentPages(Controller):
    """The task settings page's Environment form (same services as `.../environment`)."""

    path = "/{owner:str}/{name:str}/settings/tasks/environment"
    include_in_schema = False

    @post("/")
    async def environment(
        self,
        request: Request[Any, Any, Any],
        db: DatabaseDep,
        actor: ActorDep,
        settings: SettingsDep,
        owner: FromPath[str],
        name: FromPath[str],
        data: URLEncodedBody[EnvironmentForm],
    ) -> Template:
        try:
            async with db.session(write=True) as s:
                res = await repositories.load(s, actor.principal, owner, name, Action.REPO_ADMIN)
                notice = await _environment_change(s, settings, actor, res, data)
        except InvalidInput as exc:
            return await render_settings(
                request, db, actor, owner, name, notice=None, env_error=exc.detail,
                env_typed=data.declaration, status_code=exc.status,
            )  # fmt: skip
        return await render_settings(request, db, actor, owner, name, notice=notice)


async def _environment_change(s: Any, settings: Any, actor: Any, res: Any, data: EnvironmentForm) -> str:
    if data.action == "rebuild":
        done = await repo_settings.rebuild_environment(s, actor, res)
        return f"The environment is built again at the next task (generation {done.generation})."
    if data.action == "remove" or not data.declaration.strip():
        await repo_settings.set_environment(s, settings, actor, res, None)
        return "Environment removed from the settings: the repository's file applies."
    await repo_settings.set_environment(s, settings, actor, res, data.declaration.replace("\r\n", "\n"))
    return "Environment saved."


class EnvironmentCheckForm(WebForm):
    command: str = ""  # the smoke command
    agent: str = ""  # the bot the check runs as ("": the first that may work on the repository)


# What a refusal of a check can name (a field or an error code) -> the check form's input.
CHECK_ALIASES = {
    "command": "check_command",
    "command_required": "check_command",
    "invalid_command": "check_command",
    "agent": "check_agent",
    "invalid_agent": "check_agent",
}
CHECK_INPUTS = ("check_command", "check_agent")
COMMAND_MAX = 10_000  # as `POST .../environment/check` takes it


def check_request(form: EnvironmentCheckForm) -> EnvironmentCheckForm:
    """The form as `check_task` takes it (the REST body's fields), refused like that body would be."""
    command = form.command.replace("\r\n", "\n").strip()
    if not command:
        raise InvalidInput("a smoke command to run in the environment is required", code="command_required")
    if len(command) > COMMAND_MAX:
        raise InvalidInput(f"the command is longer than {COMMAND_MAX:,} characters", code="invalid_command")
    return EnvironmentCheckForm(command=command, agent=form.agent.strip()[:40])


class EnvironmentCheckPages(Controller):
    """The Environment section's "Check environment": the same command task as
    `POST .../environment/check`, then its outcome on the settings page (`?check=N`), which the
    page polls (`/check/N`, a fragment) until the check is done. Repository admins only."""

    path = "/{owner:str}/{name:str}/settings/tasks/environment/check"
    include_in_schema = False
    dependencies = PAGE_DEPENDENCIES

    @post("/", opt={"repo_action": Action.REPO_ADMIN})
    async def check(
        self,
        request: Request[Any, Any, Any],
        db: DatabaseDep,
        actor: ActorDep,
        repo_scope: RepoScopeDep,
        data: URLEncodedBody[EnvironmentCheckForm],
    ) -> Template | Redirect:
        owner, name = repo_scope.owner, repo_scope.name

        async def start() -> int:
            read = await start_task(repo_scope, await check_task(repo_scope, check_request(data)))
            return read.number

        async def again(exc: ForgeError) -> Template:
            # Shown again as typed, the refusal beside the input it concerns.
            errors = form_errors(exc, CHECK_INPUTS, CHECK_ALIASES)
            return await render_settings(
                request, db, actor, owner, name, notice=None, check_form=data, check_errors=errors,
                status_code=exc.status,
            )  # fmt: skip

        number = await or_form_error(start(), again)
        if isinstance(number, Template):
            return number
        return Redirect(f"/{owner}/{name}/settings/tasks/?check={number}#environment-check", status_code=303)

    @get("/{number:int}", opt={"repo_action": Action.REPO_ADMIN})
    async def outcome(
        self, request: Request[Any, Any, Any], repo_scope: RepoScopeDep, number: FromPath[int]
    ) -> Template:
        """The check's outcome as the settings page shows it (what the page polls while it runs)."""
        check = await environment_check.read(repo_scope.session, repo_scope.res, number)
        context = repo_context(
            repo_scope.res, repo_scope.actor.principal, request.app.state.settings.effective_base_url
        )
        reply = page(request, "tasks/_environment_check.html", check=check, **context)
        reply.headers["Cache-Control"] = "no-store"
        return reply
