"""REST for reviews and merge: submit and list reviews, the diff under review, the merge rules'
verdict, and the merge itself (see tasks/reviews.py and tasks/merging.py)."""

from litestar import Controller, get, post
from litestar.datastructures import State
from litestar.params import FromPath, JSONBody
from sqlalchemy.ext.asyncio import AsyncSession

from forge import repositories
from forge.access import Action
from forge.audit import Actor
from forge.db import Database
from forge.deps import ActorDep, DatabaseDep, DbSession
from forge.git.schemas import Comparison
from tasks.merging import MergeService
from tasks.reviews import ReviewService
from tasks.routes import TASK, load_task, service_for, task_system
from tasks.schemas import MergeCreate, ReviewCreate, ReviewRead, ReviewStatus, TaskRead
from tasks.service import TaskService, parse_number


def merge_service(db: DatabaseDep, state: State) -> MergeService:
    def make(session: AsyncSession) -> TaskService:
        return service_for(session, state)

    return MergeService(db, make)


async def submit_review(
    db: Database, state: State, actor: Actor, owner: str, name: str, n: int, data: ReviewCreate
) -> tuple[ReviewRead, int]:
    """A change request's policy check runs before the write transaction (see PromptCheck)."""
    async with db.session() as s:
        res, svc, task = await load_task(s, state, actor, owner, name, n)
        checked = await ReviewService(svc).precheck(actor, res, task, data)
    async with db.session(write=True) as s:
        res = await repositories.load(s, actor.principal, owner, name, Action.TASK_READ)
        svc = service_for(s, state)
        reviews = ReviewService(svc)
        task = await svc.get(res, n)
        review = await reviews.submit(actor, res, task, data, checked=checked)
        [read] = [r for r in await reviews.reviews(task) if r.id == review.uuid]
        return read, task.id


class ReviewController(Controller):
    tags = ["reviews"]

    @get(TASK + "/compare", summary="The diff under review: base...head at the task's head commit")
    async def compare(
        self,
        db_session: DbSession,
        actor: ActorDep,
        state: State,
        owner: FromPath[str],
        name: FromPath[str],
        number: FromPath[str],
    ) -> Comparison:
        n = parse_number(number)
        res, svc, task = await load_task(db_session, state, actor, owner, name, n)
        return await ReviewService(svc).comparison(res, task)

    @get(TASK + "/reviews", summary="The task's reviews, oldest first (outdated ones included)")
    async def list_reviews(
        self,
        db_session: DbSession,
        actor: ActorDep,
        state: State,
        owner: FromPath[str],
        name: FromPath[str],
        number: FromPath[str],
    ) -> list[ReviewRead]:
        n = parse_number(number)
        _res, svc, task = await load_task(db_session, state, actor, owner, name, n)
        return await ReviewService(svc).reviews(task)

    @post(
        TASK + "/reviews",
        summary="Review the task's head: approve, request changes (starts a follow-up run) or comment",
        status_code=201,
    )
    async def submit(
        self,
        db: DatabaseDep,
        actor: ActorDep,
        state: State,
        owner: FromPath[str],
        name: FromPath[str],
        number: FromPath[str],
        data: JSONBody[ReviewCreate],
    ) -> ReviewRead:
        n = parse_number(number)
        read, task_id = await submit_review(db, state, actor, owner, name, n, data)
        task_system(state).changed(task_id)
        return read

    @get(TASK + "/review-status", summary="Whether the merge rules hold now, and why not")
    async def status(
        self,
        db_session: DbSession,
        actor: ActorDep,
        state: State,
        owner: FromPath[str],
        name: FromPath[str],
        number: FromPath[str],
    ) -> ReviewStatus:
        n = parse_number(number)
        _res, svc, task = await load_task(db_session, state, actor, owner, name, n)
        return await ReviewService(svc).status(task)

    @post(
        TASK + "/merge",
        summary="Merge the task into its base (409 with a reason when the rules or a conflict refuse it)",
        status_code=200,
    )
    async def merge(
        self,
        db: DatabaseDep,
        actor: ActorDep,
        state: State,
        owner: FromPath[str],
        name: FromPath[str],
        number: FromPath[str],
        data: JSONBody[MergeCreate],
    ) -> TaskRead:
        n = parse_number(number)
        task_id = await merge_service(db, state).merge(actor, owner, name, n, data)
        task_system(state).changed(task_id)
        async with db.session() as s:
            res, svc, task = await load_task(s, state, actor, owner, name, n)
            return await svc.to_read(task, res)
