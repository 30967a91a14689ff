"""What a task's start checks, and the task it would create (`prepare_start`): who may start, no
NUL anywhere, a goal, the runtime and its command (the command runtime's, or a configured ACP
agent), a model the run can have, an active bot that may work on the repository, a base that is a
branch. `TaskService.precheck_start` and `TaskService.start` (tasks.py) share it."""

from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from forge.accounts import accounts
from forge.core.access import Action, Principal, can
from forge.core.error_codes import Code
from forge.core.errors import Forbidden, InvalidInput
from forge.core.settings import Settings
from forge.core.text import require_no_nul
from forge.core.worker_labels import checked_labels
from forge.db.audit import Actor
from forge.db.models import Account
from forge.git import RefNotFound, RepoStore, resolve_ref, validate_branch_name
from forge.git.errors import InvalidRefName
from forge.repos.repositories import RepoResource, resource_for
from tasks.core import repo_settings
from tasks.core.agent_registry import AcpAgent, acp_agent
from tasks.core.models import RepoTaskSettings, Task
from tasks.core.schemas import TaskCreate, argv_of
from tasks.core.states import TaskState
from tasks.services import environment_images, rules


def refuse_nul(data: TaskCreate) -> None:
    """What a start stores ends up in the sandbox's argv and environment, where a NUL cannot go
    (the run would fail `internal`), and in PostgreSQL, which cannot store one: refused here."""
    for value, what in (
        (data.goal, "a goal"),
        (data.title, "a title"),
        (data.agent, "an agent"),
        (data.base, "a base branch"),
        (data.agent_command or "", "an agent command"),
    ):
        require_no_nul(value, what)


def title_from_goal(goal: str) -> str:
    first = goal.strip().splitlines()[0] if goal.strip() else "task"
    return first[:120].rstrip() + ("…" if len(first) > 120 else "")


async def agent_for(session: AsyncSession, res: RepoResource, login: str) -> Account:
    """The bot a start names: active, and one that may work on the repository."""
    agent = await accounts.get_by_login(session, login)
    if agent is None or not agent.is_bot or agent.disabled:
        raise InvalidInput(f"{login!r} is not an active bot account", code="invalid_agent")
    agent_principal = Principal(account_id=agent.id, login=agent.login, type="Bot", via="session")
    if not rules.may_work_as_agent(agent_principal, await resource_for(session, res.repo, agent_principal)):
        raise InvalidInput(f"the bot {agent.login!r} needs write access to {res.full_name}", code="invalid_agent")
    return agent


def command_of(data: TaskCreate, runtime: str) -> str | list[str] | None:
    """The command runtime's command (checked); None for the other runtimes."""
    if runtime != "command":
        if data.command is not None:
            raise InvalidInput("`command` is for the command runtime", code="invalid_command")
        return None
    try:
        command = data.command if isinstance(data.command, str) else list(data.command or [])
        argv_of(command)
    except ValueError:
        raise InvalidInput("the command runtime needs a command", code="command_required") from None
    if any("\x00" in a for a in ([command] if isinstance(command, str) else command)):
        raise InvalidInput("command arguments may not contain NUL", code="invalid_command")
    return command


def acp_agent_of(settings: Settings, data: TaskCreate) -> AcpAgent:
    """The configured ACP agent an acp start names, available to run."""
    if not data.agent_command:
        raise InvalidInput("the acp runtime needs `agent_command`", code="agent_command_required")
    try:
        agent = acp_agent(settings.acp_agents, data.agent_command)
    except ValueError as exc:
        raise InvalidInput(str(exc), code="unknown_acp_agent") from None
    if agent is None:
        raise InvalidInput(f"no ACP agent named {data.agent_command!r} is configured", code="unknown_acp_agent")
    if agent.unavailable:
        raise InvalidInput(
            f"the ACP agent {agent.name!r} cannot run yet: {agent.unavailable}", code="acp_agent_unavailable"
        )
    return agent


async def environment_override_of(
    session: AsyncSession, actor: Actor, res: RepoResource, settings: Settings, data: TaskCreate
) -> dict[str, Any] | None:
    """The task's environment override as stored: repository admins only (403 otherwise), the image
    one an environment may name (422 `invalid_environment`)."""
    override = data.environment_override
    if override is None or not (override.image.strip() or override.extra_setup.strip()):
        return None
    if not can(actor.principal, Action.REPO_ADMIN, res):
        raise Forbidden(
            "only a repository admin may override the environment of a task",
            code="environment_override_needs_admin",
        )
    image = override.image.strip()
    allowed_images = await environment_images.allowed_images(session, settings)
    if image and image not in allowed_images:
        allowed = ", ".join(sorted(allowed_images))
        raise InvalidInput(
            f"the image {image!r} is not one an environment may use ({allowed})", code="invalid_environment"
        )
    if "\x00" in override.extra_setup:
        raise InvalidInput("the extra setup step contains NUL", code="invalid_environment")
    return {"image": image, "extra_setup": override.extra_setup}


async def required_labels_of(session: AsyncSession, res: RepoResource, data: TaskCreate) -> list[str]:
    """The labels the worker that claims the task's runs must have: the repository's task settings'
    and the start's, together (422 `invalid_worker_labels` naming a bad one)."""
    row = await session.get(RepoTaskSettings, res.repo.id)
    try:
        return checked_labels([*(row.worker_labels or [] if row is not None else []), *data.worker_labels])
    except ValueError as exc:
        raise InvalidInput(f"worker_labels: {exc}", code=Code.INVALID_WORKER_LABELS) from None


async def prepare_start(
    session: AsyncSession, settings: Settings, store: RepoStore, actor: Actor, res: RepoResource, data: TaskCreate
) -> tuple[Task, Account]:
    """Everything a start checks, and the task it would create (not added, no number yet)."""
    rules.require_start(actor.principal, res)
    refuse_nul(data)
    goal = data.goal.strip()
    if not goal:
        raise InvalidInput("the goal is required", code="goal_required")
    runtime = data.runtime or ("command" if data.command is not None else "builtin")
    command = command_of(data, runtime)
    acp_provider = ""
    if runtime == "acp":
        agent_cfg = acp_agent_of(settings, data)
        command, acp_provider = agent_cfg.name, agent_cfg.provider
    elif data.agent_command is not None:
        raise InvalidInput("`agent_command` is for the acp runtime", code="invalid_agent_command")
    await repo_settings.require_model(
        session, settings, res.repo.id, runtime, actor.principal.account_id, acp_provider=acp_provider
    )
    agent = await agent_for(session, res, data.agent)
    base = data.base.strip() or res.repo.default_branch
    try:
        validate_branch_name(base)
        resolved = await store.read(res.key, resolve_ref, base)
    except (RefNotFound, InvalidRefName):
        raise InvalidInput(f"the base branch {base!r} does not exist", code="base_not_found") from None
    if resolved.kind != "branch":
        raise InvalidInput(f"{base!r} is not a branch", code="base_not_found")
    override = await environment_override_of(session, actor, res, settings, data)
    labels = await required_labels_of(session, res, data)
    task = Task(
        environment_override=override,
        required_labels=labels,
        repo_id=res.repo.id,
        number=0,
        title=data.title.strip() or title_from_goal(goal),
        goal=goal,
        runtime=runtime,
        command=command,
        agent_id=agent.id,
        started_by_id=actor.principal.account_id,
        base=base,
        branch="",
        base_sha=resolved.sha,
        head_sha="",
        state=TaskState.QUEUED,
        conversation=[],
    )
    return task, agent
