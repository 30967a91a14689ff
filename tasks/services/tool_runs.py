"""Custom tools' runs (docs/tools.md, "Runs"): reading them, and a person's decision on a call that
waits for approval. The run itself (its container) is the run layer's (tasks/run/tool_calls.py).

- A decision is one conditional UPDATE (`awaiting_approval` and not expired -> `queued` or
  `denied`): of two approvals at once exactly one wins, the other is told it was decided; an
  approval after the expiry changes nothing and runs nothing.
- Who decides: whoever may decide the task's parked calls (`rules.require_decide`).
- Who reads: a repository's admins every run (test runs included); others with access to the
  repository's tasks the runs of tasks; instance tools' test runs the instance admins."""

from collections.abc import Sequence
from typing import Any, cast

from sqlalchemy import CursorResult, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from forge.core.access import INSTANCE, Action, Principal, can
from forge.core.errors import InvalidState, NotFound
from forge.db import audit
from forge.db.audit import Actor
from forge.db.engine import utcnow
from forge.db.models import Account
from forge.repos.repositories import RepoResource
from tasks.core.custom_tool_schemas import ToolRunRead
from tasks.core.lifecycle import Lifecycle
from tasks.core.models import Task
from tasks.core.states import ToolRunState
from tasks.core.tool_models import CustomTool, CustomToolRun
from tasks.core.transcript import Notice, Pending
from tasks.services import rules

RUNS_PAGE_MAX = 100


def _sees_test_runs(principal: Principal, res: RepoResource | None) -> bool:
    if res is None:
        return can(principal, Action.INSTANCE_ADMIN, INSTANCE)
    return rules.may_configure(principal, res)


async def reads(session: AsyncSession, runs: Sequence[CustomToolRun]) -> list[ToolRunRead]:
    ids = {r.requested_by_id for r in runs} | {r.decided_by_id for r in runs}
    wanted = {i for i in ids if i is not None}
    found = await session.execute(select(Account.id, Account.login).where(Account.id.in_(wanted)))
    logins = dict(found.tuples().all())
    task_ids = {r.task_id for r in runs if r.task_id is not None}
    numbers = dict((await session.execute(select(Task.id, Task.number).where(Task.id.in_(task_ids)))).tuples().all())
    return [
        ToolRunRead(
            id=r.id, tool_id=r.tool_id, tool=r.tool_name, version=r.version, state=r.state, inputs=r.inputs,
            inputs_hash=r.inputs_hash, exit_code=r.exit_code, output=r.output, failure_reason=r.failure_reason,
            repository=None, task=numbers.get(r.task_id) if r.task_id is not None else None,
            requested_by=logins.get(r.requested_by_id) if r.requested_by_id else None,
            decided_by=logins.get(r.decided_by_id) if r.decided_by_id else None,
            created_at=r.created_at, started_at=r.started_at, finished_at=r.finished_at,
            duration_ms=r.duration_ms, expires_at=r.expires_at,
        )
        for r in runs
    ]  # fmt: skip


async def of_tool(
    session: AsyncSession, principal: Principal, res: RepoResource | None, tool: CustomTool, *, limit: int = 30
) -> list[CustomToolRun]:
    """A tool's runs, newest first: the runs this repository's tasks made (an instance tool's runs
    by other repositories' tasks are not this repository's to read) and, for admins, test runs."""
    stmt = select(CustomToolRun).where(CustomToolRun.tool_id == tool.id)
    if res is not None:
        stmt = stmt.where(CustomToolRun.repo_id == res.repo.id)
    if not _sees_test_runs(principal, res):
        stmt = stmt.where(CustomToolRun.task_id.is_not(None))
    stmt = stmt.order_by(CustomToolRun.id.desc()).limit(max(1, min(limit, RUNS_PAGE_MAX)))
    return list((await session.scalars(stmt)).all())


async def awaiting(session: AsyncSession, task_id: int, *, limit: int) -> list[CustomToolRun]:
    """A task's tool runs waiting for a person's decision, oldest first (the task page's cards)."""
    stmt = (
        select(CustomToolRun)
        .where(CustomToolRun.task_id == task_id, CustomToolRun.state == ToolRunState.AWAITING_APPROVAL.value)
        .order_by(CustomToolRun.id)
        .limit(limit)
    )
    return list((await session.scalars(stmt)).all())


async def get(session: AsyncSession, principal: Principal, res: RepoResource | None, run_id: int) -> CustomToolRun:
    run = await session.get(CustomToolRun, run_id)
    missing = NotFound(f"no tool run {run_id} here", code="not_found")
    if run is None:
        raise missing
    if res is not None and run.repo_id != res.repo.id:
        raise missing
    if run.task_id is None and not _sees_test_runs(principal, res):
        raise missing
    return run


async def decide(
    life: Lifecycle, actor: Actor, res: RepoResource, run: CustomToolRun, *, approve: bool, reason: str = ""
) -> CustomToolRun:
    """Approve (`queued`: the waiting call runs exactly these inputs, once) or deny it. Conditional
    on the run still waiting and not expired: a second decision, or one after the expiry, is 409."""
    s = life.session
    if run.task_id is None:
        raise InvalidState("a test run does not wait for approval", code="invalid_state")
    # The task's lock first, as every writer of a task and its runs takes them (a recovery ending
    # the run cancels its tool runs under it): the other order could deadlock with it.
    task = await life.lock_id(run.task_id)
    rules.require_decide(actor.principal, res, task)
    now = utcnow()
    new = ToolRunState.QUEUED if approve else ToolRunState.DENIED
    stmt = (
        update(CustomToolRun)
        .where(
            CustomToolRun.id == run.id,
            CustomToolRun.state == ToolRunState.AWAITING_APPROVAL.value,
            CustomToolRun.expires_at > now,
        )
        .values(state=new.value, decided_by_id=actor.principal.account_id, decided_at=now)
        .execution_options(synchronize_session=False)
    )
    changed = cast(CursorResult[Any], await s.execute(stmt)).rowcount
    if not changed:
        await s.refresh(run)
        raise InvalidState(
            f"tool run {run.id} is {run.state}: it no longer waits for a decision"
            + (" (it expired)" if run.expires_at is not None and run.expires_at <= now else ""),
            code="invalid_state",
        )
    await s.refresh(run)
    verb = "approved" if approve else "denied"
    text = f"{actor.principal.login} {verb} the custom_{run.tool_name} call (version {run.version}, tool run {run.id})"
    if reason:
        text += f": {reason[:500]}"
    await life.append(task.id, [Pending(kind="notice", payload=Notice(text=text))])
    target = f"{res.repo.owner.login}/{res.repo.name}#{task.number}:tool_run:{run.id}"
    audit.record(s, actor, f"tool_run.{'approve' if approve else 'deny'}", target, inputs_hash=run.inputs_hash)
    return run


async def expire_due(session: AsyncSession) -> int:
    """Calls whose approval time passed: `expired` (they run nothing)."""
    stmt = (
        update(CustomToolRun)
        .where(CustomToolRun.state == ToolRunState.AWAITING_APPROVAL.value, CustomToolRun.expires_at <= utcnow())
        .values(state=ToolRunState.EXPIRED.value, finished_at=utcnow())
        .execution_options(synchronize_session=False)
    )
    return cast(CursorResult[Any], await session.execute(stmt)).rowcount or 0
