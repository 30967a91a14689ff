"""The approval use cases: list a task's parked tool calls and decide one (see tasks/core/parked.py
for the life of an approval)."""

from sqlalchemy import select

from forge.core.errors import InvalidState, NotFound
from forge.core.text import require_no_nul
from forge.db import audit
from forge.db.audit import Actor
from forge.db.engine import utcnow
from forge.repos.repositories import RepoResource
from tasks.core import payloads
from tasks.core.lifecycle import PromptCheck
from tasks.core.models import Approval, Task
from tasks.core.parked import is_due
from tasks.core.schemas import ApprovalDecide, ApprovalRead
from tasks.core.states import ApprovalState, RunKind, TaskState
from tasks.core.transcript import Notice, Pending
from tasks.services import rules
from tasks.services.reads import approval_reads
from tasks.services.tasks import TaskService


class ApprovalService:
    def __init__(self, tasks: TaskService) -> None:
        self.tasks = tasks
        self.session = tasks.session
        self.life = tasks.life

    async def list(self, task: Task) -> list[ApprovalRead]:
        rows = (
            (await self.session.execute(select(Approval).where(Approval.task_id == task.id).order_by(Approval.id)))
            .scalars()
            .all()
        )
        return await approval_reads(self.session, rows)

    async def read(self, approval: Approval) -> ApprovalRead:
        [read] = await approval_reads(self.session, [approval])
        return read

    @staticmethod
    def _check_decider(actor: Actor, res: RepoResource, task: Task, data: ApprovalDecide) -> str:
        rules.require_decide(actor.principal, res, task)
        return require_no_nul(data.reason, "a reason").strip()

    async def _find(self, task: Task, approval_id: str, *, lock: bool) -> Approval:
        query = select(Approval).where(Approval.uuid == approval_id, Approval.task_id == task.id)
        if lock:
            query = query.with_for_update().execution_options(populate_existing=True)
        a = (await self.session.execute(query)).scalar_one_or_none()
        if a is None:
            raise NotFound("approval not found", code="approval_not_found")
        return a

    @staticmethod
    def _check_decidable(task: Task, a: Approval, data: ApprovalDecide) -> None:
        if a.state != ApprovalState.PENDING:
            raise InvalidState(f"the approval is already {a.state}", code="approval_not_pending", state=a.state)
        if is_due(a):
            raise InvalidState(
                f"the approval expired at {a.expires_at.isoformat()}",
                code="approval_expired",
                state=ApprovalState.EXPIRED.value,
            )
        if data.input_hash and data.input_hash != a.input_hash:
            raise InvalidState(
                "the parked input is not the one you reviewed (input_hash differs)", code="approval_input_mismatch"
            )
        if task.state != TaskState.BLOCKED:
            raise InvalidState(f"the task is {task.state}, not blocked", code="invalid_task_state")

    async def precheck(
        self, actor: Actor, res: RepoResource, task: Task, approval_id: str, data: ApprovalDecide
    ) -> PromptCheck | None:
        """A denial's reason reaches the agent: it is a prompt (`user_prompt_submit`, kind
        `answer`), asked before the write transaction like any other, and only about an approval
        that exists and can be decided (the write checks again under the lock)."""
        reason = self._check_decider(actor, res, task, data)
        self._check_decidable(task, await self._find(task, approval_id, lock=False), data)
        if data.decision != "deny" or not reason:
            return None
        return await self.tasks.precheck_prompt(await self.tasks.gate_ctx(task, res, actor), reason, "answer")

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
        task = await self.life.lock(task)
        a = await self._find(task, approval_id, lock=True)
        self._check_decidable(task, a, data)
        approve = data.decision == "approve"
        if not approve and reason:
            reason = await self.life.check_prompt(
                await self.tasks.gate_ctx(task, res, actor), reason, "answer", checked
            )
        a.state = ApprovalState.APPROVED if approve else ApprovalState.DENIED
        a.decided_by_id = actor.principal.account_id
        a.decided_at = utcnow()
        a.decision_reason = reason
        run = await self.life.enqueue(task, res.repo, RunKind.APPROVAL, "", actor.principal)
        a.resume_run_id = run.id
        verb = "approved" if approve else "denied"
        text = f"{actor.principal.login} {verb} the {a.tool_name} call"
        text += f": {a.decision_reason}" if a.decision_reason else ""
        await self.life.append(task.id, [Pending(kind="notice", payload=Notice(text=text), run_id=run.id)])
        await self.life.publish(
            "approval.resolved",
            task,
            res.repo,
            actor=actor.principal,
            run=run,
            data=payloads.approval_resolved(a, decision_reason=a.decision_reason),
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
