"""The shape every prompt-carrying write of the task routes takes, written once for REST and pages:
the policy's `user_prompt_submit` precheck runs outside the write transaction (in the request's
read session, whose connection goes back to the pool first: a slow consumer holds neither the
database's write lock nor a pooled connection), then one write
transaction re-reads what it changes and stores it (see `PromptCheck`). Wake-ups follow that
commit by themselves (`tasks.core.lifecycle`)."""

import time
from collections.abc import Awaitable, Callable
from typing import Any, Literal, TypeVar

from sqlalchemy import func, select

from forge.core.errors import InvalidInput
from forge.repos.pulls import Pulls
from forge.repos.repositories import RepoResource
from tasks.core.lifecycle import PromptCheck
from tasks.core.models import Run, Task
from tasks.core.schemas import (
    ApprovalDecide,
    ApprovalRead,
    MergeCreate,
    MessageCreate,
    ReviewCommentCreate,
    ReviewCreate,
    ReviewDraftRead,
    ReviewRead,
    TaskCreate,
    TaskRead,
)
from tasks.core.states import RunState
from tasks.http.deps import RepoScope, TaskScope
from tasks.services import agents, pull_work
from tasks.services.approvals import ApprovalService
from tasks.services.environment_check import CHECK_TITLE
from tasks.services.reads import release
from tasks.services.review_drafts import DraftService
from tasks.services.reviews import ReviewService
from tasks.services.tasks import TaskService
from tasks.system import TaskSystem

STOP_WAIT_SECONDS = 60.0

Act = Literal["message", "answer", "retry", "close", "stop"]
Result = TypeVar("Result")
Checked = TypeVar("Checked", bound=PromptCheck | None)


async def precheck_then_write(
    scope: TaskScope,
    precheck: Callable[[TaskService, RepoResource, Task], Awaitable[Checked]],
    write: Callable[[TaskService, RepoResource, Task, Checked], Awaitable[Result]],
) -> Result:
    """`precheck` on the request's read session, then `write` on a fresh write transaction where
    the repository (and the caller's access) and the task are read again."""
    checked = await precheck(scope.svc, scope.res, scope.task)
    await release(scope.session)  # the write may queue for its turn: not on a read connection
    async with scope.system.db.session(write=True) as s:
        res, svc, task = await scope.reload(s)
        return await write(svc, res, task, checked)


async def start_task(scope: RepoScope, data: TaskCreate) -> TaskRead:
    """Start a task (REST and the start form); the goal's policy check runs before the write. On a
    pull request (`on_pull_request`), the start is composed from it first (`pull_work`)."""
    actor = scope.actor
    svc = scope.svc
    data = await pull_work.for_pull_request(Pulls(scope.session, svc.store, svc.bus, svc.base_url), scope.res, data)
    checked = await svc.precheck_start(actor, scope.res, data)
    await release(scope.session)
    async with scope.system.db.session(write=True) as s:
        res, svc = await scope.load_repo(s)
        task = await svc.start(actor, res, data, checked=checked)
        await pull_work.link(Pulls(s, svc.store, svc.bus, svc.base_url), actor, res, task, data.on_pull_request)
        return await svc.to_read(task, res)


async def act_on_task(scope: TaskScope, action: Act, body: MessageCreate | None) -> TaskRead:
    """One action on a task (REST and the task page). `stop` only asks (the worker settles it)."""
    actor = scope.actor

    async def precheck(svc: TaskService, res: RepoResource, task: Task) -> PromptCheck | None:
        if action in ("message", "answer") and body is not None:
            return await svc.precheck(actor, res, task, body, "message" if action == "message" else "answer")
        return None

    async def write(svc: TaskService, res: RepoResource, task: Task, checked: PromptCheck | None) -> TaskRead:
        if action == "message" and body is not None:
            task = await svc.message(actor, res, task, body, checked=checked)
        elif action == "answer" and body is not None:
            task = await svc.answer(actor, res, task, body, checked=checked)
        elif action == "retry":
            task = await svc.retry(actor, res, task)
        elif action == "close":
            task = await svc.close(actor, res, task)
        else:
            await svc.request_stop(actor, res, task)
        return await svc.to_read(task, res)

    return await precheck_then_write(scope, precheck, write)


async def stop_and_wait(scope: TaskScope, timeout: float = STOP_WAIT_SECONDS) -> TaskRead:  # noqa: ASYNC109
    """Stop; when a run was running, wait until its worker removed the sandbox and settled."""
    await release(scope.session)
    async with scope.system.db.session(write=True) as s:
        res, svc, task = await scope.reload(s)
        pending = await svc.request_stop(scope.actor, res, task)
    if pending is not None:
        await wait_for_stop(scope.system, scope.task.id, timeout)
    async with scope.system.db.session() as s:
        res, svc, task = await scope.reload(s)
        return await svc.to_read(task, res)


async def wait_for_stop(system: TaskSystem, task_id: int, timeout: float) -> None:  # noqa: ASYNC109
    """Until no run of the task is running (its worker removed the sandbox before settling)."""
    deadline = time.monotonic() + timeout
    with system.hub.waiter(task_id) as waiter:
        while time.monotonic() < deadline:
            async with system.db.session() as s:
                running = (
                    await s.execute(
                        select(func.count(Run.id)).where(Run.task_id == task_id, Run.state == RunState.RUNNING)
                    )
                ).scalar_one()
            if not running:
                return
            await waiter.wait(min(1.0, max(0.0, deadline - time.monotonic())))


async def decide_approval(scope: TaskScope, approval_id: str, data: ApprovalDecide) -> ApprovalRead:
    """A denial's reason is a prompt: its policy check runs before the write transaction."""
    actor = scope.actor
    approval_id = approval_id[:64]

    async def precheck(svc: TaskService, res: RepoResource, task: Task) -> PromptCheck | None:
        return await ApprovalService(svc).precheck(actor, res, task, approval_id, data)

    async def write(svc: TaskService, res: RepoResource, task: Task, checked: PromptCheck | None) -> ApprovalRead:
        approvals = ApprovalService(svc)
        return await approvals.read(await approvals.decide(actor, res, task, approval_id, data, checked=checked))

    return await precheck_then_write(scope, precheck, write)


async def submit_review(scope: TaskScope, data: ReviewCreate) -> ReviewRead:
    """A change request's policy check runs before the write transaction."""
    actor = scope.actor

    async def precheck(svc: TaskService, res: RepoResource, task: Task) -> PromptCheck | None:
        return await ReviewService(svc).precheck(actor, res, task, data)

    async def write(svc: TaskService, res: RepoResource, task: Task, checked: PromptCheck | None) -> ReviewRead:
        reviews = ReviewService(svc)
        review = await reviews.submit(actor, res, task, data, checked=checked)
        [read] = [r for r in await reviews.reviews(task) if r.id == review.uuid]
        return read

    return await precheck_then_write(scope, precheck, write)


async def merge_task(scope: TaskScope, data: MergeCreate) -> TaskRead:
    """Merge (the service runs its own read, `pre_merge` hook, then write); the task as it is now."""
    await release(scope.session)
    await scope.system.merge_service().merge(scope.actor, scope.owner, scope.name, scope.number, data)
    async with scope.system.db.session() as s:
        res, svc, task = await scope.reload(s)
        return await svc.to_read(task, res)


async def change_draft(
    scope: TaskScope, change: Callable[[DraftService, RepoResource, Task], Awaitable[object]]
) -> ReviewDraftRead:
    """Change the caller's review draft in a write transaction; the draft as it is then."""
    await release(scope.session)
    async with scope.system.db.session(write=True) as s:
        res, svc, task = await scope.reload(s)
        drafts = DraftService(ReviewService(svc))
        await change(drafts, res, task)
        return await drafts.read(scope.actor, res, task)


async def add_draft_comment(scope: TaskScope, data: ReviewCommentCreate) -> ReviewDraftRead:
    return await change_draft(scope, lambda drafts, res, task: drafts.add(scope.actor, res, task, data))


async def remove_draft_comment(scope: TaskScope, comment_id: int) -> ReviewDraftRead:
    return await change_draft(scope, lambda drafts, res, task: drafts.remove(scope.actor, res, task, comment_id))


async def check_task(scope: RepoScope, data: Any) -> TaskCreate:
    """The command task of an environment check (`POST .../environment/check` and the settings
    page's "Check environment"): the smoke command, run as the given bot or the first one that may
    work on the repository."""
    login = data.agent or next(iter(await agents.eligible_agents(scope.session, scope.res)), "")
    if not login:
        raise InvalidInput("no bot may work on this repository: add one as a collaborator", code="invalid_agent")
    return TaskCreate(
        goal=f"Check the environment: {data.command}", agent=login, command=data.command, title=CHECK_TITLE
    )
