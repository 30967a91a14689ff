"""Approvals: tool calls parked for a person (hooks-protocol.md, `pre_tool_use` ask and hold).

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

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from forge import audit
from forge.access import Action, Principal, require
from forge.audit import Actor
from forge.db import Database, utcnow
from forge.errors import Forbidden, InvalidState, NotFound
from forge.events import EventBus
from forge.models import Account, Repository
from forge.repositories import RepoResource
from forge.text import require_no_nul
from tasks import transcript
from tasks.models import Approval, Run, Task
from tasks.runtime import ApprovalRequest, input_hash
from tasks.schemas import ApprovalDecide, ApprovalRead
from tasks.service import PromptCheck, TaskService, publish, set_state
from tasks.states import FailureReason, RunKind, TaskState
from tasks.transcript import Notice, Pending

PENDING, APPROVED, DENIED, EXPIRED, CANCELLED = "pending", "approved", "denied", "expired", "cancelled"


def _event_data(a: Approval, **more: Any) -> dict[str, Any]:
    return {
        "approval_id": a.uuid,
        "tool_use_id": a.tool_use_id,
        "tool_name": a.tool_name,
        "tool_input": a.tool_input,
        "input_hash": a.input_hash,
        "reason": a.reason,
        "held": a.held,
        "requested_by": a.requested_by,
        "expires_at": a.expires_at.isoformat(),
        "state": a.state,
        **more,
    }


async def park(
    s: AsyncSession,
    bus: EventBus,
    task: Task,
    repo: Repository,
    run: Run,
    request: ApprovalRequest,
    *,
    ttl_seconds: int,
    base_url: str,
) -> Approval:
    """Store the parked call (in the transaction that blocks the task) and announce it."""
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
        state=PENDING,
        expires_at=utcnow() + timedelta(seconds=ttl_seconds),
    )
    s.add(approval)
    await s.flush()
    why = "an endpoint failed and its failure policy holds the call" if request.held else "a policy asks a person"
    text = f"the {request.tool_name} call waits for approval ({why}"
    text += f": {request.reason})" if request.reason else ")"
    await transcript.append(s, task.id, [Pending(kind="notice", payload=Notice(text=text, level="warning"))])
    await publish(s, bus, "approval.requested", task, repo, base_url=base_url, run=run, data=_event_data(approval))
    return approval


async def pending_for(s: AsyncSession, task_id: int) -> Approval | None:
    return (
        await s.execute(
            select(Approval).where(Approval.task_id == task_id, Approval.state == PENDING).order_by(Approval.id.desc())
        )
    ).scalar_one_or_none()


async def to_read(s: AsyncSession, a: Approval) -> ApprovalRead:
    decider = await s.get(Account, a.decided_by_id) if a.decided_by_id else None
    run = await s.get(Run, a.run_id)
    # A pending approval past its time reads as expired even before the sweeper settles it.
    state = EXPIRED if a.state == PENDING and is_due(a) else a.state
    return ApprovalRead(
        id=a.uuid,
        state=state,
        tool_use_id=a.tool_use_id,
        tool_name=a.tool_name,
        tool_input=a.tool_input if isinstance(a.tool_input, dict) else {},
        input_hash=a.input_hash,
        reason=a.reason,
        held=a.held,
        requested_by=a.requested_by,
        run=run.seq if run is not None else 0,
        created_at=a.created_at,
        expires_at=a.expires_at,
        decided_by=decider.login if decider else None,
        decided_at=a.decided_at,
        decision_reason=a.decision_reason,
    )


def is_due(a: Approval, now: datetime | None = None) -> bool:
    return (now or utcnow()) >= a.expires_at


async def cancel_pending(
    s: AsyncSession, bus: EventBus, task: Task, repo: Repository, *, base_url: str, actor: Principal | None
) -> None:
    """The task stops: its pending approval (if any) is cancelled, never to run."""
    a = await pending_for(s, task.id)
    if a is None:
        return
    a.state = CANCELLED
    a.decided_at = utcnow()
    a.decided_by_id = actor.account_id if actor is not None else None
    await publish(s, bus, "approval.resolved", task, repo, base_url=base_url, actor=actor, data=_event_data(a))


class ApprovalService:
    def __init__(self, tasks: TaskService) -> None:
        self.tasks = tasks
        self.session = tasks.session

    async def list(self, task: Task) -> list[ApprovalRead]:
        rows = (
            (await self.session.execute(select(Approval).where(Approval.task_id == task.id).order_by(Approval.id)))
            .scalars()
            .all()
        )
        return [await to_read(self.session, a) for a in rows]

    def _check_decider(self, actor: Actor, res: RepoResource, task: Task, data: ApprovalDecide) -> str:
        require(actor.principal, Action.TASK_WRITE, res)
        if actor.principal.account_id == task.agent_id:
            # `ask` means ask a person: the agent cannot answer for its own calls.
            raise Forbidden("the task's agent cannot decide its own tool calls", code="agent_cannot_decide")
        return require_no_nul(data.reason, "a reason").strip()

    async def precheck(self, actor: Actor, res: RepoResource, task: Task, data: ApprovalDecide) -> PromptCheck | None:
        """A denial's reason reaches the agent: it is a prompt (`user_prompt_submit`, kind
        `answer`), asked before the write transaction like any other."""
        reason = self._check_decider(actor, res, task, data)
        if data.decision != "deny" or not reason:
            return None
        return await self.tasks.precheck_prompt(await self.tasks._gate_ctx(task, res, actor), reason, "answer")

    async def decide(
        self,
        actor: Actor,
        res: RepoResource,
        task: Task,
        approval_id: str,
        data: ApprovalDecide,
        *,
        checked: PromptCheck | None = None,
    ) -> Approval:
        """Approve or deny a parked call; either way an `approval` run resumes the task."""
        reason = self._check_decider(actor, res, task, data)
        task = await self.tasks._lock(task)
        a = (
            await self.session.execute(
                select(Approval)
                .where(Approval.uuid == approval_id, Approval.task_id == task.id)
                .with_for_update()
                .execution_options(populate_existing=True)
            )
        ).scalar_one_or_none()
        if a is None:
            raise NotFound("approval not found", code="approval_not_found")
        if a.state != PENDING:
            raise InvalidState(f"the approval is already {a.state}", code="approval_not_pending", state=a.state)
        if is_due(a):
            raise InvalidState(
                f"the approval expired at {a.expires_at.isoformat()}", code="approval_expired", state=EXPIRED
            )
        if data.input_hash and data.input_hash != a.input_hash:
            raise InvalidState(
                "the parked input is not the one you reviewed (input_hash differs)", code="approval_input_mismatch"
            )
        if task.state != TaskState.BLOCKED:
            raise InvalidState(f"the task is {task.state}, not blocked", code="invalid_task_state")
        approve = data.decision == "approve"
        if not approve and reason:
            reason = await self.tasks._check_prompt(
                await self.tasks._gate_ctx(task, res, actor), reason, "answer", checked
            )
        a.state = APPROVED if approve else DENIED
        a.decided_by_id = actor.principal.account_id
        a.decided_at = utcnow()
        a.decision_reason = reason
        run = await self.tasks._enqueue(actor, res, task, RunKind.APPROVAL, "")
        a.resume_run_id = run.id
        verb = "approved" if approve else "denied"
        text = f"{actor.principal.login} {verb} the {a.tool_name} call"
        text += f": {a.decision_reason}" if a.decision_reason else ""
        await transcript.append(
            self.session, task.id, [Pending(kind="notice", payload=Notice(text=text), run_id=run.id)]
        )
        await publish(
            self.session,
            self.tasks.bus,
            "approval.resolved",
            task,
            res.repo,
            base_url=self.tasks.base_url,
            actor=actor.principal,
            run=run,
            data=_event_data(a, decision_reason=a.decision_reason),
        )
        audit.record(
            self.session,
            actor,
            "task.approval",
            f"{res.full_name}#{task.number}",
            decision=data.decision,
            approval=a.uuid,
            tool=a.tool_name,
            input_hash=a.input_hash,
        )
        return a


async def expire_due(db: Database, bus: EventBus, base_url: str) -> list[int]:
    """Expire pending approvals past their time; their tasks fail with `approval_expired`.
    Returns the ids of the tasks that changed (for live views)."""
    now = utcnow()
    async with db.session() as s:
        due = [
            (row[0], row[1])
            for row in await s.execute(
                select(Approval.id, Approval.task_id).where(Approval.state == PENDING, Approval.expires_at <= now)
            )
        ]
    if not due:
        return []  # the common case costs one read, no write lock
    changed: list[int] = []
    async with db.session(write=True) as s:
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
            if a is None or a.state != PENDING:
                continue  # decided in the meantime
            repo = await s.get(Repository, task.repo_id)
            assert repo is not None
            a.state = EXPIRED
            a.decided_at = now
            minutes = max(1, round((a.expires_at - a.created_at).total_seconds() / 60))
            text = f"nobody decided the {a.tool_name} call within {minutes} min: the approval expired"
            await transcript.append(s, task.id, [Pending(kind="notice", payload=Notice(text=text, level="error"))])
            await publish(s, bus, "approval.resolved", task, repo, base_url=base_url, data=_event_data(a))
            if task.state == TaskState.BLOCKED:
                task.error = f"{text}; retry to let the agent go on without it"
                task.failure_reason = FailureReason.APPROVAL_EXPIRED.value
                await set_state(s, bus, task, repo, TaskState.FAILED, base_url=base_url)
            changed.append(task.id)
    return changed
