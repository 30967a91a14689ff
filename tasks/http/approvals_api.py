"""REST for approvals: the tool calls a policy parked for a person (see tasks/core/parked.py)."""

from litestar import Controller, get, post
from litestar.params import FromPath, JSONBody

from tasks.core.schemas import ApprovalDecide, ApprovalRead
from tasks.http.actions import decide_approval
from tasks.http.deps import DEPENDENCIES, TASK, TaskScopeDep
from tasks.services.approvals import ApprovalService


class ApprovalController(Controller):
    tags = ["tasks"]
    dependencies = DEPENDENCIES

    @get(TASK + "/approvals", summary="Tool calls parked for a person (policy `ask` or failure policy `hold`)")
    async def list_approvals(self, task_scope: TaskScopeDep) -> list[ApprovalRead]:
        return await ApprovalService(task_scope.svc).list(task_scope.task)

    @post(
        TASK + "/approvals/{approval_id:str}",
        summary="Approve or deny a parked tool call (write access); the task resumes either way",
        status_code=200,
    )
    async def decide(
        self, task_scope: TaskScopeDep, approval_id: FromPath[str], data: JSONBody[ApprovalDecide]
    ) -> ApprovalRead:
        return await decide_approval(task_scope, approval_id, data)
