"""The steps every use case and the worker take on a task, in the caller's transaction: lock the
task, open a run and queue it, change the state (checked against the graph), publish events,
write transcript events, and the `user_prompt_submit` check of a prompt.

Whatever touches a task here also schedules, after the commit, one "task N changed" for live
views and the worker (`forge.db.engine.after_commit`): no handler has to remember to wake anybody, and
nobody is woken by a transaction that rolled back."""

from collections.abc import Callable, Sequence

import msgspec
from msgspec import UNSET
from sqlalchemy import func, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession

from forge.core.access import Principal
from forge.core.errors import BadGateway, Forbidden
from forge.db.engine import after_commit, utcnow
from forge.db.events import (
    AccountRef,
    Event,
    EventBus,
    EventPayload,
    EventType,
    ParentRef,
    RunRef,
    TaskCreated,
    TaskRef,
)
from forge.db.models import Account, Repository
from forge.db.payload_base import TriggerRef
from tasks.core import payloads, transcript
from tasks.core.models import Run, Task, TaskCounter
from tasks.core.policy import GateContext, GateDecision, PolicyGate, PromptKind
from tasks.core.states import RunKind, RunState, TaskState, check_transition
from tasks.core.transcript import Pending, Prompt

Changed = Callable[[int], None]


def gate_context(
    task: Task, repo_full: str, repo_uuid: str, base_url: str, actor: Principal, agent: str, parent: int | None = None
) -> GateContext:
    return GateContext(
        parent_number=parent,
        repository=repo_full,
        repo_uuid=repo_uuid,
        task_uuid=task.uuid,
        task_number=task.number,
        task_url=f"{base_url}/{repo_full}/tasks/{task.number}",
        actor_login=actor.login,
        actor_type="Bot" if actor.type == "Bot" else "User",
        agent_login=agent,
        trigger=msgspec.convert(task.trigger, TriggerRef) if task.trigger else None,
    )


async def account_ref(session: AsyncSession, account_id: int | None) -> AccountRef | None:
    if account_id is None:
        return None
    acc = await session.get(Account, account_id)
    if acc is None:
        return None
    return AccountRef(login=acc.login, type="Bot" if acc.is_bot else "User")


async def queue_position(session: AsyncSession, task: Task) -> int | None:
    """1-based place of the task's queued run among all queued runs (None when not queued)."""
    if task.state != TaskState.QUEUED:
        return None
    run_id = (
        await session.execute(select(func.min(Run.id)).where(Run.task_id == task.id, Run.state == RunState.QUEUED))
    ).scalar_one_or_none()
    if run_id is None:
        return None
    ahead = (
        await session.execute(select(func.count(Run.id)).where(Run.state == RunState.QUEUED, Run.id < run_id))
    ).scalar_one()
    return int(ahead) + 1


async def allocate_number(session: AsyncSession, repo_id: int) -> int:
    dialect = session.get_bind().dialect.name
    insert_fn = postgresql.insert if dialect == "postgresql" else sqlite.insert
    await session.execute(
        insert_fn(TaskCounter).values(repo_id=repo_id, last_number=0).on_conflict_do_nothing(index_elements=["repo_id"])
    )
    # The UPDATE locks the counter row until commit (PostgreSQL); SQLite writers hold the database lock.
    stmt = (
        update(TaskCounter)
        .where(TaskCounter.repo_id == repo_id)
        .values(last_number=TaskCounter.last_number + 1)
        .returning(TaskCounter.last_number)
        .execution_options(synchronize_session=False)
    )
    return int((await session.execute(stmt)).scalar_one())


class PromptCheck(msgspec.Struct, frozen=True, kw_only=True):
    """A `user_prompt_submit` decision taken before the write transaction (so a slow consumer
    never holds the database's write lock), reused when the same prompt of the same task comes
    to be stored. Anything different (a concurrent start took the predicted number, a comment
    arrived meanwhile) is asked again."""

    task_uuid: str
    number: int
    kind: str
    original: str
    result: str


def obey(decision: GateDecision, text: str) -> str:
    """The prompt to store after the policy's decision (or the error it means)."""
    if decision.failed:
        raise BadGateway(decision.reason, code="hook_dispatch_failed")
    if decision.decision != "allow":
        raise Forbidden(decision.user_message or decision.reason or "a policy refused this", code="policy_denied")
    if decision.input_override and isinstance(decision.input_override.get("prompt"), str):
        return str(decision.input_override["prompt"])
    return text


async def precheck_prompt(gate: PolicyGate, ctx: GateContext, text: str, kind: PromptKind) -> PromptCheck:
    """Ask the policy now, outside the write transaction; the dispatcher logs the call itself."""
    decision = await gate.user_prompt_submit(ctx, prompt=text, kind=kind, session=None)
    return PromptCheck(
        task_uuid=ctx.task_uuid, number=ctx.task_number, kind=kind, original=text, result=obey(decision, text)
    )


class Lifecycle:
    """The task steps on one session. `changed(task_id)` runs after the commit for every task a
    step touched (the live hub's notify: live views and the worker listen to it)."""

    def __init__(
        self,
        session: AsyncSession,
        *,
        bus: EventBus,
        base_url: str,
        gate: PolicyGate | None = None,
        changed: Changed | None = None,
    ) -> None:
        self.session = session
        self.bus = bus
        self.base_url = base_url
        self.gate = gate
        self.changed = changed

    def touched(self, task_id: int) -> None:
        """Schedule "task N changed" for after the commit (once per task and transaction)."""
        changed = self.changed
        if changed is not None:
            after_commit(self.session, ("tasks.changed", task_id), lambda: changed(task_id))

    async def lock(self, task: Task) -> Task:
        """Re-read the task row under a lock (PostgreSQL FOR UPDATE; SQLite writers are serialized)."""
        return (
            await self.session.execute(
                select(Task).where(Task.id == task.id).with_for_update().execution_options(populate_existing=True)
            )
        ).scalar_one()

    async def lock_id(self, task_id: int) -> Task:
        return (await self.session.execute(select(Task).where(Task.id == task_id).with_for_update())).scalar_one()

    async def publish(
        self,
        type_: EventType,
        task: Task,
        repo: Repository,
        *,
        actor: Principal | None = None,
        run: Run | None = None,
        data: EventPayload,
    ) -> None:
        """Publish `data` (its tag is the event type: `type_` says at the call site what it must be)."""
        if data.type != type_:
            raise ValueError(f"a {data.type} payload published as {type_}")
        full = f"{repo.owner.login}/{repo.name}"
        parent = await self.session.get(Task, task.parent_id) if task.parent_id is not None else None
        actor_ref = AccountRef.of(actor)
        await self.bus.publish(
            self.session,
            Event(
                repo_id=repo.id,
                repo_uuid=repo.uuid,
                repository=full,
                task=TaskRef(
                    id=task.uuid,
                    number=task.number,
                    url=f"{self.base_url}/{full}/tasks/{task.number}",
                    parent=ParentRef(number=parent.number) if parent is not None else None,
                    trigger=msgspec.convert(task.trigger, TriggerRef) if task.trigger else None,
                ),
                run=RunRef(id=run.uuid, seq=run.seq) if run is not None else None,
                actor=actor_ref,
                agent=await account_ref(self.session, task.agent_id),
                data=data,
            ),
        )
        self.touched(task.id)

    async def set_state(
        self,
        task: Task,
        repo: Repository,
        new: TaskState,
        *,
        actor: Principal | None = None,
        run: Run | None = None,
    ) -> None:
        """The one way a task changes state: checked, timestamped, published."""
        old = TaskState(task.state)
        check_transition(old, new)
        task.state = new
        task.updated_at = utcnow()
        await self.session.flush()
        data = payloads.state_changed(
            old,
            new,
            queue_position=await queue_position(self.session, task) if new is TaskState.QUEUED else UNSET,
            reason=task.failure_reason,
            error=task.error,
        )
        await self.publish("task.state_changed", task, repo, actor=actor, run=run, data=data)

    async def append(self, task_id: int, events: Sequence[Pending]) -> list[int]:
        """Transcript events of the task (stored in this transaction, followed after the commit)."""
        self.touched(task_id)
        return await transcript.append(self.session, task_id, events)

    async def new_run(self, task: Task, kind: RunKind, prompt: str, requested_by_id: int | None) -> Run:
        seq = (
            await self.session.execute(select(func.coalesce(func.max(Run.seq), 0)).where(Run.task_id == task.id))
        ).scalar_one()
        run = Run(
            task_id=task.id,
            repo_id=task.repo_id,
            seq=int(seq) + 1,
            kind=kind,
            state=RunState.QUEUED,
            prompt=prompt,
            requested_by_id=requested_by_id,
            skipped=[],
        )
        self.session.add(run)
        await self.session.flush()
        self.touched(task.id)
        return run

    async def open(
        self, task: Task, repo: Repository, goal: str, actor: Principal, *, requested_by_id: int | None, source: str
    ) -> Run:
        """A new task's first run and prompt, published as `task.created` and `task.state_changed`."""
        run = await self.new_run(task, RunKind.START, goal, requested_by_id)
        prompt = Prompt(text=goal, source=source, author=actor.login)
        await self.append(task.id, [Pending(kind="prompt", payload=prompt, run_id=run.id)])
        await self.publish("task.created", task, repo, actor=actor, data=TaskCreated())
        position = await queue_position(self.session, task)
        data = payloads.state_changed(None, TaskState.QUEUED, queue_position=position)
        await self.publish("task.state_changed", task, repo, actor=actor, run=run, data=data)
        return run

    async def enqueue(self, task: Task, repo: Repository, kind: RunKind, prompt: str, actor: Principal) -> Run:
        """A new run for a task a person acts on: the question and last error are cleared, the
        task is queued for a worker."""
        run = await self.new_run(task, kind, prompt, actor.account_id)
        task.question = ""
        task.question_options = None
        task.error = ""
        task.failure_reason = ""
        await self.set_state(task, repo, TaskState.QUEUED, actor=actor, run=run)
        return run

    async def gate_ctx(self, task: Task, repo_full: str, repo_uuid: str, actor: Principal) -> GateContext:
        agent = await self.session.get(Account, task.agent_id)
        parent = await self.session.get(Task, task.parent_id) if task.parent_id is not None else None
        return gate_context(task, repo_full, repo_uuid, self.base_url, actor, agent.login if agent else "",
                            parent.number if parent is not None else None)  # fmt: skip

    async def check_prompt(
        self, ctx: GateContext, text: str, kind: PromptKind, checked: PromptCheck | None = None
    ) -> str:
        """The prompt to store: the precheck's result when it was about this very prompt, else
        the policy asked now, in this transaction."""
        if checked is not None and (checked.task_uuid, checked.number, checked.kind, checked.original) == (
            ctx.task_uuid,
            ctx.task_number,
            kind,
            text,
        ):
            return checked.result
        assert self.gate is not None, "a prompt check needs the policy gate"
        decision = await self.gate.user_prompt_submit(ctx, prompt=text, kind=kind, session=self.session)
        return obey(decision, text)
