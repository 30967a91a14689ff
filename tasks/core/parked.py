"""Approvals: tool calls parked for a person (docs/webhooks.md, `pre_tool_use` ask and hold).

Life of an approval:
- the builtin runtime gets `ask` from a policy consumer (or an endpoint with failure policy `hold`
  fails); the run ends `blocked` and the worker parks the call here (`park`), bound to the exact
  input by the SHA-256 of its canonical JSON, expiring after `task_approval_ttl_seconds`;
- a collaborator with write access approves or denies it (`ApprovalService.decide`): either way
  an `approval` run resumes the task, which runs exactly the stored input (approve) or tells the
  model a person refused it (deny);
- nobody decides in time: the worker's sweeper expires it and the task fails with
  `approval_expired` (a retry lets the agent go on without that call);
- the task is stopped: the approval is cancelled.
Each step publishes `approval.requested` or `approval.resolved` and writes a transcript notice."""

from collections.abc import Callable
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from forge.core.access import Principal
from forge.db.engine import Database, utcnow
from forge.db.models import Repository
from tasks.core import payloads
from tasks.core.lifecycle import Lifecycle
from tasks.core.models import Approval, Run, Task
from tasks.core.policy import ApprovalRequest, input_hash
from tasks.core.states import ApprovalState, FailureReason, TaskState
from tasks.core.transcript import Notice, Pending


async def park(
    life: Lifecycle, task: Task, repo: Repository, run: Run, request: ApprovalRequest, *, ttl_seconds: int
) -> Approval:
    """Store the parked call (in the transaction that blocks the task) and announce it."""
    s = life.session
    approval = Approval(
        task_id=task.id,
        repo_id=task.repo_id,
        run_id=run.id,
        tool_use_id=request.tool_use_id,
        tool_name=request.tool_name,
        tool_input=request.tool_input,
        input_hash=input_hash(request.tool_input),
        reason=request.reason,
        held=request.held,
        requested_by=request.requested_by,
        delivery_id=request.delivery_id,
        state=ApprovalState.PENDING,
        expires_at=utcnow() + timedelta(seconds=ttl_seconds),
    )
    s.add(approval)
    await s.flush()
    why = "an endpoint failed and its failure policy holds the call" if request.held else "a policy asks a person"
    text = f"the {request.tool_name} call waits for approval ({why}"
    text += f": {request.reason})" if request.reason else ")"
    await life.append(task.id, [Pending(kind="notice", payload=Notice(text=text, level="warning"))])
    await life.publish("approval.requested", task, repo, run=run, data=payloads.approval_requested(approval))
    return approval


async def pending_for(s: AsyncSession, task_id: int) -> Approval | None:
    return (
        await s.execute(
            select(Approval)
            .where(Approval.task_id == task_id, Approval.state == ApprovalState.PENDING)
            .order_by(Approval.id.desc())
        )
    ).scalar_one_or_none()


def is_due(a: Approval, now: datetime | None = None) -> bool:
    return (now or utcnow()) >= a.expires_at


async def cancel_pending(life: Lifecycle, task: Task, repo: Repository, *, actor: Principal | None) -> None:
    """The task stops: its pending approval (if any) is cancelled, never to run."""
    a = await pending_for(life.session, task.id)
    if a is None:
        return
    a.state = ApprovalState.CANCELLED
    a.decided_at = utcnow()
    a.decided_by_id = actor.account_id if actor is not None else None
    await life.publish("approval.resolved", task, repo, actor=actor, data=payloads.approval_resolved(a))


async def expire_due(db: Database, lifecycle: Callable[[AsyncSession], Lifecycle]) -> list[int]:
    """Expire pending approvals past their time; their tasks fail with `approval_expired`.
    Returns the ids of the tasks that changed (their live views are woken after the commit)."""
    now = utcnow()
    async with db.session() as s:
        due = [
            (row[0], row[1])
            for row in await s.execute(
                select(Approval.id, Approval.task_id).where(
                    Approval.state == ApprovalState.PENDING, Approval.expires_at <= now
                )
            )
        ]
    if not due:
        return []  # the common case costs one read, no write lock
    changed: list[int] = []
    async with db.session(write=True) as s:
        life = lifecycle(s)
        for approval_id, task_id in sorted(due):
            # The task first, then its approval: the order decide and stop lock them in.
            task = (await s.execute(select(Task).where(Task.id == task_id).with_for_update())).scalar_one()
            a = (
                await s.execute(
                    select(Approval)
                    .where(Approval.id == approval_id)
                    .with_for_update()
                    .execution_options(populate_existing=True)
                )
            ).scalar_one_or_none()
            if a is None or a.state != ApprovalState.PENDING:
                continue  # decided in the meantime
            repo = await s.get(Repository, task.repo_id)
            assert repo is not None
            a.state = ApprovalState.EXPIRED
            a.decided_at = now
            minutes = max(1, round((a.expires_at - a.created_at).total_seconds() / 60))
            text = f"nobody decided the {a.tool_name} call within {minutes} min: the approval expired"
            await life.append(task.id, [Pending(kind="notice", payload=Notice(text=text, level="error"))])
            await life.publish("approval.resolved", task, repo, data=payloads.approval_resolved(a))
            if task.state == TaskState.BLOCKED:
                task.error = f"{text}; retry to let the agent go on without it"
                task.failure_reason = FailureReason.APPROVAL_EXPIRED.value
                await life.set_state(task, repo, TaskState.FAILED)
            changed.append(task.id)
    return changed
