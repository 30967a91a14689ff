"""The task use cases: start (its checks in `starting.py`), message, answer, retry, stop, close,
and the reads that find a task. REST and pages call these (through `tasks.http.actions`); each checks who may act
(`tasks.services.rules`), takes its steps through `tasks.core.lifecycle` (transition check,
events, transcript, the after-commit wake-up) and writes an audit row, in the caller's transaction."""

import re
import uuid as uuid_mod
from collections.abc import Sequence

import msgspec
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from forge.core.access import Principal
from forge.core.errors import InvalidInput, InvalidState, NotFound
from forge.core.settings import Settings
from forge.core.text import require_no_nul
from forge.db import audit
from forge.db.audit import Actor
from forge.db.engine import utcnow
from forge.db.events import EventBus
from forge.db.models import Repository
from forge.git import RepoStore
from forge.repos.pulls import Pulls
from forge.repos.repositories import RepoResource, resource_for
from tasks.core import task_pulls
from tasks.core.lifecycle import (
    Changed,
    Lifecycle,
    PromptCheck,
    allocate_number,
    gate_context,
    precheck_prompt,
)
from tasks.core.models import Approval, Run, Task, TaskCounter
from tasks.core.parked import cancel_pending
from tasks.core.policy import GateContext, PolicyGate, PromptKind
from tasks.core.schemas import MessageCreate, TaskCreate, TaskRead, Trigger
from tasks.core.states import ApprovalState, RunKind, RunState, TaskState
from tasks.core.subtasks import active_children, report_to_parent
from tasks.core.transcript import Notice, Pending, Prompt
from tasks.services import rules
from tasks.services.reads import release, task_reads
from tasks.services.starting import prepare_start

_SLUG = re.compile(r"[^a-z0-9]+")


def slugify(text: str, limit: int = 40) -> str:
    slug = _SLUG.sub("-", text.lower()).strip("-")[:limit].strip("-")
    return slug or "task"


def parse_number(raw: str) -> int:
    """Task numbers are positive integers written plainly; anything else is 404."""
    if not raw.isascii() or not raw.isdigit() or raw.startswith("0") or len(raw) > 9:
        raise NotFound("task not found", code="task_not_found")
    return int(raw)


def prompt_event(text: str, source: str, author: str, run: Run) -> Pending:
    return Pending(kind="prompt", payload=Prompt(text=text, source=source, author=author), run_id=run.id)


def notice(text: str, run: Run | None = None) -> Pending:
    return Pending(kind="notice", payload=Notice(text=text), run_id=run.id if run is not None else None)


def dropped_message_notice(body: str) -> Pending:
    quoted = body if len(body) <= 300 else body[:299] + "…"
    text = (
        f"The task was stopped: the queued message was not delivered to the agent (retry, then send it again): {quoted}"
    )
    return Pending(kind="notice", payload=Notice(text=text, level="warning"))


class TaskService:
    def __init__(
        self,
        session: AsyncSession,
        *,
        bus: EventBus,
        store: RepoStore,
        settings: Settings,
        gate: PolicyGate,
        changed: Changed | None = None,
    ) -> None:
        self.session = session
        self.bus = bus
        self.store = store
        self.settings = settings
        self.gate = gate
        self.life = Lifecycle(session, bus=bus, base_url=settings.effective_base_url, gate=gate, changed=changed)

    @property
    def base_url(self) -> str:
        return self.settings.effective_base_url

    # --- reads --------------------------------------------------------------------------------

    async def get(self, res: RepoResource, number: int) -> Task:
        task = (
            await self.session.execute(select(Task).where(Task.repo_id == res.repo.id, Task.number == number))
        ).scalar_one_or_none()
        if task is None:
            raise NotFound("task not found", code="task_not_found")
        return task

    async def list_tasks(
        self, res: RepoResource, *, state: str | None = None, limit: int = 100, offset: int = 0
    ) -> Sequence[Task]:
        stmt = select(Task).where(Task.repo_id == res.repo.id).order_by(Task.number.desc()).limit(limit).offset(offset)
        if state:
            try:
                stmt = stmt.where(Task.state == TaskState(state))
            except ValueError:
                raise InvalidInput(f"unknown state {state!r}", code="invalid_state_filter") from None
        return (await self.session.execute(stmt)).scalars().all()

    async def list_for_user(self, principal: Principal, *, limit: int = 100) -> list[tuple[Task, RepoResource]]:
        """Tasks the account started or works on as the agent, where it still may read tasks."""
        if principal.account_id is None:
            return []
        stmt = (
            select(Task)
            .where((Task.started_by_id == principal.account_id) | (Task.agent_id == principal.account_id))
            .order_by(Task.updated_at.desc())
            .limit(limit)
        )
        tasks = (await self.session.execute(stmt)).scalars().all()
        repo_ids = {t.repo_id for t in tasks}
        repos = {
            r.id: r
            for r in (await self.session.execute(select(Repository).where(Repository.id.in_(repo_ids)))).scalars()
        }
        resources: dict[int, RepoResource | None] = {}
        out: list[tuple[Task, RepoResource]] = []
        for task in tasks:
            if task.repo_id not in resources:
                repo = repos.get(task.repo_id)
                res = await resource_for(self.session, repo, principal) if repo is not None else None
                resources[task.repo_id] = res if res is not None and rules.may_read(principal, res) else None
            found = resources[task.repo_id]
            if found is not None:
                out.append((task, found))
        return out

    async def to_read(self, task: Task, res: RepoResource) -> TaskRead:
        [read] = await task_reads(self.session, self.base_url, [(task, res)])
        return read

    async def to_reads(self, page: Sequence[tuple[Task, RepoResource]]) -> list[TaskRead]:
        """A page of tasks in a constant number of queries (see `tasks.services.reads`)."""
        return await task_reads(self.session, self.base_url, page)

    async def gate_ctx(self, task: Task, res: RepoResource, actor: Actor) -> GateContext:
        return await self.life.gate_ctx(task, res.full_name, res.repo.uuid, actor.principal)

    async def precheck_prompt(self, ctx: GateContext, text: str, kind: PromptKind) -> PromptCheck:
        """On a read session only (a precheck precedes the write): its connection goes back to
        the pool before the policy consumer is asked, however long that takes."""
        await release(self.session)
        return await precheck_prompt(self.gate, ctx, text, kind)

    # --- start --------------------------------------------------------------------------------

    async def precheck_start(self, actor: Actor, res: RepoResource, data: TaskCreate) -> PromptCheck:
        """Validate a start and ask `user_prompt_submit` before any write, about the task the
        start will most likely create (a fresh uuid, the next number)."""
        task, agent = await prepare_start(self.session, self.settings, self.store, actor, res, data)
        last = await self.session.get(TaskCounter, res.repo.id)
        task.number = (last.last_number if last is not None else 0) + 1
        task.uuid = str(uuid_mod.uuid4())
        ctx = gate_context(task, res.full_name, res.repo.uuid, self.base_url, actor.principal, agent.login)
        return await self.precheck_prompt(ctx, task.goal, "goal")

    async def start(
        self,
        actor: Actor,
        res: RepoResource,
        data: TaskCreate,
        *,
        checked: PromptCheck | None = None,
        trigger: Trigger | None = None,
    ) -> Task:
        """Start a task as `actor` (the start rule, the checks of `prepare_start`, the policy's
        `user_prompt_submit`), in the caller's transaction. `trigger`: what started it when no
        person's start did (a schedule, an issue, a mention), kept on the task and in its events."""
        task, agent = await prepare_start(self.session, self.settings, self.store, actor, res, data)
        task.trigger = msgspec.to_builtins(trigger) if trigger is not None else None
        task.number = await allocate_number(self.session, res.repo.id)
        task.branch = f"agent/{task.number}-{slugify(task.title)}"
        if checked is not None:
            task.uuid = checked.task_uuid
        ctx = gate_context(task, res.full_name, res.repo.uuid, self.base_url, actor.principal, agent.login)
        goal = await self.life.check_prompt(ctx, task.goal, "goal", checked)
        task.goal = goal
        self.session.add(task)
        await self.session.flush()
        await self.life.open(
            task, res.repo, goal, actor.principal, requested_by_id=actor.principal.account_id, source="start"
        )
        audit.record(
            self.session,
            actor,
            "task.start",
            f"{res.full_name}#{task.number}",
            runtime=task.runtime,
            agent=agent.login,
            base=task.base,
            **({"trigger": trigger.kind} if trigger is not None else {}),
        )
        return task

    # --- actions on a task --------------------------------------------------------------------

    async def _valid_message(self, task: Task, data: MessageCreate) -> str:
        body = require_no_nul(data.body, "a message").strip()
        if not body:
            raise InvalidInput("the message is empty", code="body_required")
        state = TaskState(task.state)
        if state.is_terminal:
            raise InvalidState(f"the task is {state.value}", code="invalid_task_state")
        if state is TaskState.BLOCKED and await self._approval_pending(task):
            raise InvalidState(
                "a tool call waits for approval: approve or deny it first (a denial's reason reaches the agent)",
                code="approval_pending",
            )
        return body

    @staticmethod
    def _valid_answer(task: Task, data: MessageCreate) -> str:
        body = require_no_nul(data.body, "an answer").strip()
        if not body:
            raise InvalidInput("the answer is empty", code="body_required")
        if task.state != TaskState.BLOCKED or not task.question:
            raise InvalidState("the task has no pending question", code="no_pending_question")
        return body

    async def _approval_pending(self, task: Task) -> bool:
        found = await self.session.execute(
            select(Approval.id).where(Approval.task_id == task.id, Approval.state == ApprovalState.PENDING).limit(1)
        )
        return found.first() is not None

    async def precheck(
        self, actor: Actor, res: RepoResource, task: Task, data: MessageCreate, kind: PromptKind
    ) -> PromptCheck:
        """Validate a message or an answer and ask `user_prompt_submit` before any write."""
        rules.require_act(actor.principal, res)
        body = await self._valid_message(task, data) if kind == "message" else self._valid_answer(task, data)
        return await self.precheck_prompt(await self.gate_ctx(task, res, actor), body, kind)

    async def message(
        self, actor: Actor, res: RepoResource, task: Task, data: MessageCreate, *, checked: PromptCheck | None = None
    ) -> Task:
        rules.require_act(actor.principal, res)
        task = await self.life.lock(task)
        body = await self._valid_message(task, data)
        body = await self.life.check_prompt(await self.gate_ctx(task, res, actor), body, "message", checked)
        target = f"{res.full_name}#{task.number}"
        login = actor.principal.login
        if TaskState(task.state).is_active:
            task.queued_message = f"{task.queued_message}\n\n{body}" if task.queued_message else body
            await self.life.append(task.id, [notice(f"{login} queued a message for the next run")])
            audit.record(self.session, actor, "task.message", target, queued=True)
            return task
        run = await self.life.enqueue(task, res.repo, RunKind.MESSAGE, body, actor.principal)
        await self.life.append(task.id, [prompt_event(body, "message", login, run)])
        audit.record(self.session, actor, "task.message", target, queued=False)
        return task

    async def answer(
        self, actor: Actor, res: RepoResource, task: Task, data: MessageCreate, *, checked: PromptCheck | None = None
    ) -> Task:
        rules.require_act(actor.principal, res)
        task = await self.life.lock(task)
        body = self._valid_answer(task, data)
        body = await self.life.check_prompt(await self.gate_ctx(task, res, actor), body, "answer", checked)
        run = await self.life.enqueue(task, res.repo, RunKind.ANSWER, body, actor.principal)
        await self.life.append(task.id, [prompt_event(body, "answer", actor.principal.login, run)])
        audit.record(self.session, actor, "task.answer", f"{res.full_name}#{task.number}")
        return task

    async def retry(self, actor: Actor, res: RepoResource, task: Task) -> Task:
        rules.require_act(actor.principal, res)
        task = await self.life.lock(task)
        if task.state not in (TaskState.FAILED, TaskState.STOPPED):
            raise InvalidState(
                f"only failed or stopped tasks can be retried (this one is {task.state})", code="invalid_task_state"
            )
        last = (
            await self.session.execute(select(Run).where(Run.task_id == task.id).order_by(Run.seq.desc()).limit(1))
        ).scalar_one_or_none()
        prompt = last.prompt if last is not None else task.goal
        run = await self.life.enqueue(task, res.repo, RunKind.RETRY, prompt, actor.principal)
        await self.life.append(task.id, [notice(f"{actor.principal.login} retried the task", run)])
        audit.record(self.session, actor, "task.retry", f"{res.full_name}#{task.number}")
        return task

    async def close(self, actor: Actor, res: RepoResource, task: Task) -> Task:
        rules.require_act(actor.principal, res)
        task = await self.life.lock(task)
        if task.state == TaskState.CLOSED:
            return task
        await self.life.set_state(task, res.repo, TaskState.CLOSED, actor=actor.principal)
        await task_pulls.closed(Pulls(self.session, self.store, self.bus, self.base_url), actor, res, task)
        await self.life.append(task.id, [notice(f"{actor.principal.login} closed the task")])
        audit.record(self.session, actor, "task.close", f"{res.full_name}#{task.number}")
        return task

    async def request_stop(self, actor: Actor, res: RepoResource, task: Task) -> Run | None:
        """Stop: a queued or blocked task stops now; a running one is flagged for its worker.
        Returns the run that still has to end (the caller kills its sandbox and waits)."""
        rules.require_stop(actor.principal, res, task)
        task = await self.life.lock(task)
        state = TaskState(task.state)
        if state is TaskState.STOPPED:
            return None  # idempotent
        if state not in (TaskState.QUEUED, TaskState.RUNNING, TaskState.BLOCKED):
            raise InvalidState(f"a {state.value} task is not running", code="invalid_task_state")
        if task.queued_message:  # dropped, and said so: the sender must not think the agent has it
            await self.life.append(task.id, [dropped_message_notice(task.queued_message)])
        task.queued_message = ""
        active = (
            (
                await self.session.execute(
                    select(Run).where(Run.task_id == task.id, Run.state.in_([RunState.QUEUED, RunState.RUNNING]))
                )
            )
            .scalars()
            .all()
        )
        pending: Run | None = None
        for run in active:
            if run.state == RunState.QUEUED:
                run.state = RunState.CANCELLED
                run.finished_at = utcnow()
            else:
                run.stop_requested = True
                pending = run
        audit.record(self.session, actor, "task.stop", f"{res.full_name}#{task.number}")
        await self.life.append(task.id, [notice(f"{actor.principal.login} stopped the task")])
        if pending is None:
            task.question = ""
            task.question_options = None
            await cancel_pending(self.life, task, res.repo, actor=actor.principal)
            await self.life.set_state(task, res.repo, TaskState.STOPPED, actor=actor.principal)
            if task.parent_id is not None:
                await report_to_parent(self.life, task)
        # Its subtasks stop with it (theirs too): a running one is flagged for its own worker.
        for child in await active_children(self.session, task):
            if rules.may_stop(actor.principal, res, child):
                await self.request_stop(actor, res, child)
        return pending
