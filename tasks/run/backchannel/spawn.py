"""Spawning a subtask: a task an agent creates from its run (the back-channel's `spawn_subtask`).

A subtask is a task of its own on the parent's repository: the parent's agent, the person who
started the parent as its starter (whose rights and personal key a run uses), its own branch
from the parent's task-branch head as it stands (the last snapshot; the parent's uncommitted work
of the running run is not in it), its own token budget per run within what the parent's run has
left. The repository limits how deep subtasks nest and how many one task may spawn; over either
limit nothing is created and the agent is told why. A subtask's end on its parent's transcript and
a task's active children are `tasks/core/subtasks.py` (the worker, the settle step and the
services use them)."""

import msgspec
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from forge.core.access import Principal
from forge.core.errors import ForgeError
from forge.core.settings import Settings
from forge.db import audit
from forge.db.audit import Actor
from forge.db.models import Account, Repository
from tasks.core import repo_settings
from tasks.core.agent_registry import acp_agent
from tasks.core.lifecycle import Lifecycle, allocate_number, gate_context
from tasks.core.models import RepoTaskSettings, Run, Task
from tasks.core.states import RunState, TaskState
from tasks.core.subtasks import ACTIVE_STATES
from tasks.core.transcript import Pending, Subtask

DEFAULT_MAX_DEPTH = 2
DEFAULT_MAX_SUBTASKS = 5
NAME_MAX = 120
INSTRUCTIONS_MAX = 20_000
# Runtimes a subtask may ask for ("command" needs a command line: not for an agent to spawn).
NOT_SPAWNABLE = frozenset({"command"})
# Subtasks active at once in one repository, whatever tree they belong to.
MAX_ACTIVE_SUBTASKS = 50


class SubtaskRefused(Exception):
    """The spawn is refused; the message is what the agent is told (nothing was created)."""


class SpawnRequest(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    instructions: str
    runtime: str = ""  # "" = the parent's
    max_tokens: int | None = None


class Spawned(msgspec.Struct, frozen=True, kw_only=True):
    number: int
    title: str
    branch: str
    runtime: str
    token_budget: int | None  # per run; None = the repository's setting
    url: str


class Limits(msgspec.Struct, frozen=True, kw_only=True):
    max_depth: int = DEFAULT_MAX_DEPTH
    max_subtasks: int = DEFAULT_MAX_SUBTASKS
    other_runtimes: frozenset[str] = frozenset()  # a subtask's runtime besides its parent's


async def limits(session: AsyncSession, repo_id: int) -> Limits:
    row = await session.get(RepoTaskSettings, repo_id)
    if row is None:
        return Limits()
    return Limits(
        max_depth=row.max_subtask_depth if row.max_subtask_depth is not None else DEFAULT_MAX_DEPTH,
        max_subtasks=row.max_subtasks if row.max_subtasks is not None else DEFAULT_MAX_SUBTASKS,
        other_runtimes=frozenset(row.subtask_runtimes or ()),
    )


def _slug(text: str) -> str:
    out = "".join(c if c.isascii() and c.isalnum() else "-" for c in text.lower())
    return "-".join(p for p in out.split("-") if p)[:40].strip("-") or "task"


def _budget(request: SpawnRequest, remaining: int | None) -> int | None:
    """The child's budget per run: what it asked for, never more than the parent's run has left;
    without `max_tokens`, half of that (a grant comes off the parent's own budget: the parent
    keeps the other half to go on)."""
    if remaining is not None and remaining <= 1:
        raise SubtaskRefused("refused: this run's token budget is used up; no subtask was created")
    if request.max_tokens is None:
        return None if remaining is None else remaining // 2
    if request.max_tokens < 1:
        raise SubtaskRefused("refused: max_tokens must be a positive number of tokens; no subtask was created")
    return request.max_tokens if remaining is None else min(request.max_tokens, remaining)


def _check_text(request: SpawnRequest) -> tuple[str, str]:
    name = " ".join(request.name.split())[:NAME_MAX]
    instructions = request.instructions.strip()
    if not name or not instructions:
        raise SubtaskRefused("refused: a subtask needs a name and instructions; no subtask was created")
    if len(instructions) > INSTRUCTIONS_MAX or "\x00" in instructions or "\x00" in name:
        raise SubtaskRefused(
            f"refused: the instructions must be at most {INSTRUCTIONS_MAX} characters, without NUL; "
            "no subtask was created"
        )
    return name, instructions


async def spawn(
    life: Lifecycle,
    settings: Settings,
    *,
    parent_id: int,
    run_id: int,
    request: SpawnRequest,
    runtimes: frozenset[str],
    remaining: int | None,
) -> Spawned:
    """Create the subtask of the (locked) parent in the caller's transaction, or raise
    `SubtaskRefused` before anything is written. Refusals are the caller's to audit."""
    session = life.session
    parent = await life.lock_id(parent_id)
    repo = await session.get(Repository, parent.repo_id)
    agent = await session.get(Account, parent.agent_id)
    assert repo is not None and agent is not None
    name, instructions = _check_text(request)
    await _check_running(session, parent, run_id)
    found = await limits(session, repo.id)
    await _check_counts(session, parent, found)
    runtime = _check_runtime(parent, request.runtime or parent.runtime, runtimes, found)
    if agent.disabled:
        raise SubtaskRefused("refused: the agent's account is disabled; no subtask was created")
    command = await _check_model(session, settings, parent, runtime)
    budget = _budget(request, remaining)
    principal = Principal(account_id=agent.id, login=agent.login, type="Bot", via="internal")
    child = _child(parent, name, instructions, runtime, command, budget)
    child.number = await allocate_number(session, repo.id)
    child.branch = f"agent/{child.number}-{_slug(name)}"
    full = f"{repo.owner.login}/{repo.name}"
    await _open(life, child, parent, repo, principal, agent.login, run_id=run_id)
    audit.record(
        session,
        Actor(principal=principal),
        "task.subtask.spawn",
        f"{full}#{child.number}",
        parent=parent.number,
        runtime=runtime,
        token_budget=budget,
        depth=child.depth,
    )
    return Spawned(
        number=child.number,
        title=name,
        branch=child.branch,
        runtime=runtime,
        token_budget=budget,
        url=f"{life.base_url}/{full}/tasks/{child.number}",
    )


async def _check_running(session: AsyncSession, parent: Task, run_id: int) -> None:
    """The parent and the run that asks are live (queued or running, no stop requested)."""
    run = await session.get(Run, run_id)
    live_run = run is not None and run.state in (RunState.QUEUED, RunState.RUNNING) and not run.stop_requested
    if parent.state not in (TaskState.QUEUED, TaskState.RUNNING) or not live_run:
        # A stop's cascade has already gone over the children: one made now would run on alone.
        raise SubtaskRefused("refused: this task is stopping or no longer running; no subtask was created")


async def _check_counts(session: AsyncSession, parent: Task, found: Limits) -> None:
    """The repository's active subtasks, the parent's depth and its children, each within its limit."""
    active = (
        await session.execute(
            select(func.count(Task.id)).where(
                Task.repo_id == parent.repo_id, Task.parent_id.is_not(None), Task.state.in_(ACTIVE_STATES)
            )
        )
    ).scalar_one()
    if active >= MAX_ACTIVE_SUBTASKS:
        # The per-task limits multiply along a tree (max_subtasks ** max_subtask_depth): this bounds it.
        raise SubtaskRefused(
            f"refused: {active} subtasks are already active in this repository (at most {MAX_ACTIVE_SUBTASKS}); "
            "no subtask was created. Wait for some to end, or do the work in this task."
        )
    if parent.depth + 1 > found.max_depth:
        raise SubtaskRefused(
            f"refused: subtasks nest at most {found.max_depth} deep in this repository and this task is at depth "
            f"{parent.depth}; no subtask was created. Do the work in this task instead."
        )
    children = (await session.execute(select(func.count(Task.id)).where(Task.parent_id == parent.id))).scalar_one()
    if children >= found.max_subtasks:
        raise SubtaskRefused(
            f"refused: a task may spawn at most {found.max_subtasks} subtasks in this repository and this one has "
            f"{children}; no subtask was created. Do the work in this task instead."
        )


def _check_runtime(parent: Task, runtime: str, runtimes: frozenset[str], found: Limits) -> str:
    """The runtime asked for exists, may be spawned, and is the parent's or one the repository lists."""
    if runtime not in runtimes or runtime in NOT_SPAWNABLE:
        allowed = ", ".join(sorted(runtimes - NOT_SPAWNABLE))
        raise SubtaskRefused(f"refused: unknown runtime {runtime!r} (available: {allowed}); no subtask was created")
    if runtime != parent.runtime and runtime not in found.other_runtimes:
        # Another runtime may spend another provider's key (the starter's personal one, say) and
        # run under other policy layers: the repository's admins choose whether it may.
        others = ", ".join(sorted(found.other_runtimes & runtimes - NOT_SPAWNABLE)) or "none"
        raise SubtaskRefused(
            f"refused: a subtask runs on this task's runtime ({parent.runtime}); this repository lets subtasks "
            f"use other runtimes only where its task settings list them (subtask_runtimes: {others}), and "
            f"{runtime!r} is not listed; no subtask was created. Leave runtime out to use {parent.runtime}."
        )
    return runtime


async def _check_model(session: AsyncSession, settings: Settings, parent: Task, runtime: str) -> str | None:
    """The runtime can have a model for the parent's starter; the subtask's command (an acp
    agent's name, else None)."""
    command, acp_provider = _acp_command(settings, parent, runtime)
    try:
        await repo_settings.require_model(
            session, settings, parent.repo_id, runtime, parent.started_by_id, acp_provider=acp_provider
        )
    except ForgeError as exc:
        raise SubtaskRefused(f"refused: {exc}; no subtask was created") from None
    return command


def _child(parent: Task, name: str, instructions: str, runtime: str, command: str | None, budget: int | None) -> Task:
    """The subtask's row, queued from the parent's head (its number and branch still to give)."""
    return Task(
        repo_id=parent.repo_id,
        number=0,
        title=name,
        goal=instructions,
        runtime=runtime,
        command=command,
        agent_id=parent.agent_id,
        started_by_id=parent.started_by_id,
        base=parent.base,
        branch="",
        base_sha=parent.head_sha or parent.base_sha,
        head_sha="",
        state=TaskState.QUEUED,
        conversation=[],
        parent_id=parent.id,
        depth=parent.depth + 1,
        token_budget=budget,
        required_labels=list(parent.required_labels or []),  # the same kind of worker as its parent
    )


async def _open(
    life: Lifecycle, child: Task, parent: Task, repo: Repository, principal: Principal, agent_login: str, *, run_id: int
) -> None:
    """The instructions past `user_prompt_submit`, the subtask stored and its first run opened, the
    spawn on the parent's transcript."""
    full = f"{repo.owner.login}/{repo.name}"
    ctx = gate_context(child, full, repo.uuid, life.base_url, principal, agent_login, parent.number)
    try:
        goal = await life.check_prompt(ctx, child.goal, "goal")
    except ForgeError as exc:
        raise SubtaskRefused(f"refused by a policy: {exc}; no subtask was created") from None
    child.goal = goal
    life.session.add(child)
    await life.session.flush()
    await life.open(child, repo, goal, principal, requested_by_id=parent.started_by_id, source="subtask")
    spawned = Subtask(event="spawned", number=child.number, text=child.title, state=TaskState.QUEUED.value)
    await life.append(parent.id, [Pending(kind="subtask", payload=spawned, run_id=run_id)])


def _acp_command(settings: Settings, parent: Task, runtime: str) -> tuple[str | None, str]:
    """An `acp` subtask runs its parent's configured ACP agent (an agent cannot pick another one):
    (the task's command, the agent's model provider); (None, "") for the other runtimes."""
    if runtime != "acp":
        return None, ""
    if parent.runtime != "acp" or not parent.command:
        raise SubtaskRefused("refused: an acp subtask runs its parent's ACP agent, and this task has none")
    try:
        agent = acp_agent(settings.acp_agents, parent.command)
    except ValueError:
        agent = None
    if agent is None or agent.unavailable:
        raise SubtaskRefused(f"refused: the ACP agent {parent.command!r} is not available; no subtask was created")
    return agent.name, agent.provider
