"""REST for approvals: the tool calls a policy parked for a person (see tasks/approvals.py)."""

from litestar import Controller, get, post
from litestar.datastructures import State
from litestar.params import FromPath, JSONBody

from forge.audit import Actor
from forge.db import Database
from forge.deps import ActorDep, DatabaseDep, DbSession
from tasks.approvals import ApprovalService, to_read
from tasks.routes import TASK, load_task, task_system
from tasks.schemas import ApprovalDecide, ApprovalRead
from tasks.service import parse_number


class ApprovalController(Controller):
    tags = ["tasks"]

    @get(TASK + "/approvals", summary="Tool calls parked for a person (policy `ask` or failure policy `hold`)")
    async def list_approvals(
        self,
        db_session: DbSession,
        actor: ActorDep,
        state: State,
        owner: FromPath[str],
        name: FromPath[str],
        number: FromPath[str],
    ) -> list[ApprovalRead]:
        n = parse_number(number)
        _res, svc, task = await load_task(db_session, state, actor, owner, name, n)
        return await ApprovalService(svc).list(task)

    @post(
        TASK + "/approvals/{approval_id:str}",
        summary="Approve or deny a parked tool call (write access); the task resumes either way",
        status_code=200,
    )
    async def decide(
        self,
        db: DatabaseDep,
        actor: ActorDep,
        state: State,
        owner: FromPath[str],
        name: FromPath[str],
        number: FromPath[str],
        approval_id: FromPath[str],
        data: JSONBody[ApprovalDecide],
    ) -> ApprovalRead:
        read, task_id = await decide_approval(db, state, actor, owner, name, parse_number(number), approval_id, data)
        task_system(state).changed(task_id)
        return read


async def decide_approval(
    db: Database, state: State, actor: Actor, owner: str, name: str, n: int, approval_id: str, data: ApprovalDecide
) -> tuple[ApprovalRead, int]:
    """A denial's reason is a prompt: its policy check runs before the write transaction."""
    async with db.session() as s:
        res, svc, task = await load_task(s, state, actor, owner, name, n)
        checked = await ApprovalService(svc).precheck(actor, res, task, data)
    async with db.session(write=True) as s:
        res, svc, task = await load_task(s, state, actor, owner, name, n)
        approval = await ApprovalService(svc).decide(actor, res, task, approval_id[:64], data, checked=checked)
        return await to_read(s, approval), task.id
