"""The task service: every action (start, message, answer, retry, stop, close) and every read.
REST, web pages and the worker call these; each action checks its transition in `states`,
writes an audit row and publishes its events in the caller's transaction."""

import re
import uuid as uuid_mod
from collections.abc import Sequence
from typing import Any

import msgspec
from sqlalchemy import func, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession

from forge import audit
from forge.access import Action, Principal, Role, effective_role, require
from forge.audit import Actor
from forge.db import utcnow
from forge.errors import BadGateway, Forbidden, InvalidInput, InvalidState, NotFound
from forge.events import AccountRef, Event, EventBus, RunRef, TaskRef
from forge.git import RefNotFound, RepoStore, resolve_ref, validate_branch_name
from forge.git.errors import InvalidRefName
from forge.models import Account, Repository
from forge.repositories import RepoResource, resource_for
from forge.settings import Settings
from tasks import repo_settings, transcript
from tasks.command_runtime import argv_of
from tasks.models import Approval, Run, Task, TaskCounter
from tasks.policy import GateContext, PolicyGate, PromptKind
from tasks.schemas import MessageCreate, RunRead, TaskCreate, TaskRead
from tasks.states import RunKind, RunState, TaskState, check_transition
from tasks.transcript import Notice, Pending, Prompt

_SLUG = re.compile(r"[^a-z0-9]+")


def slugify(text: str, limit: int = 40) -> str:
    slug = _SLUG.sub("-", text.lower()).strip("-")[:limit].strip("-")
    return slug or "task"


def title_from_goal(goal: str) -> str:
    first = goal.strip().splitlines()[0] if goal.strip() else "task"
    return first[:120].rstrip() + ("…" if len(first) > 120 else "")


def parse_number(raw: str) -> int:
    """Task numbers are positive integers written plainly; anything else is 404."""
    if not raw.isascii() or not raw.isdigit() or raw.startswith("0") or len(raw) > 9:
        raise NotFound("task not found", code="task_not_found")
    return int(raw)


def gate_context(
    task: Task, repo_full: str, repo_uuid: str, base_url: str, actor: Principal, agent: str
) -> GateContext:
    return GateContext(
        repository=repo_full,
        repo_uuid=repo_uuid,
        task_uuid=task.uuid,
        task_number=task.number,
        task_url=f"{base_url}/{repo_full}/tasks/{task.number}",
        actor_login=actor.login,
        actor_type="Bot" if actor.type == "Bot" else "User",
        agent_login=agent,
    )


async def _account_ref(session: AsyncSession, account_id: int | None) -> AccountRef | None:
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


async def publish(
    session: AsyncSession,
    bus: EventBus,
    type_: Any,
    task: Task,
    repo: Repository,
    *,
    base_url: str,
    actor: Principal | None = None,
    run: Run | None = None,
    data: dict[str, Any] | None = None,
) -> None:
    full = f"{repo.owner.login}/{repo.name}"
    actor_ref = None
    if actor is not None and actor.account_id is not None:
        actor_ref = AccountRef(login=actor.login, type="Bot" if actor.type == "Bot" else "User")
    await bus.publish(
        session,
        Event(
            type=type_,
            repo_id=repo.id,
            repo_uuid=repo.uuid,
            repository=full,
            task=TaskRef(id=task.uuid, number=task.number, url=f"{base_url}/{full}/tasks/{task.number}"),
            run=RunRef(id=run.uuid, seq=run.seq) if run is not None else None,
            actor=actor_ref,
            agent=await _account_ref(session, task.agent_id),
            data=data or {},
        ),
    )


async def set_state(
    session: AsyncSession,
    bus: EventBus,
    task: Task,
    repo: Repository,
    new: TaskState,
    *,
    base_url: str,
    actor: Principal | None = None,
    run: Run | None = None,
) -> None:
    """The one way a task changes state: checked, timestamped, published."""
    old = TaskState(task.state)
    check_transition(old, new)
    task.state = new
    task.updated_at = utcnow()
    await session.flush()
    data: dict[str, Any] = {"from": old.value, "to": new.value}
    if new is TaskState.QUEUED:
        data["queue_position"] = await queue_position(session, task)
    if task.failure_reason and new is TaskState.FAILED:
        data["failure_reason"] = task.failure_reason
        data["error"] = task.error
    await publish(session, bus, "task.state_changed", task, repo, base_url=base_url, actor=actor, run=run, data=data)


async def _allocate_number(session: AsyncSession, repo_id: int) -> int:
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


class TaskService:
    def __init__(
        self, session: AsyncSession, *, bus: EventBus, store: RepoStore, settings: Settings, gate: PolicyGate
    ) -> None:
        self.session = session
        self.bus = bus
        self.store = store
        self.settings = settings
        self.gate = gate

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

    async def list_tasks(self, res: RepoResource, *, state: str | None = None, limit: int = 100) -> Sequence[Task]:
        stmt = select(Task).where(Task.repo_id == res.repo.id).order_by(Task.number.desc()).limit(limit)
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
        out: list[tuple[Task, RepoResource]] = []
        for task in (await self.session.execute(stmt)).scalars().all():
            repo = await self.session.get(Repository, task.repo_id)
            if repo is None:
                continue
            res = await resource_for(self.session, repo, principal)
            try:
                require(principal, Action.TASK_READ, res)
            except (NotFound, Forbidden):
                continue
            out.append((task, res))
        return out

    async def runs(self, task: Task) -> Sequence[Run]:
        return (await self.session.execute(select(Run).where(Run.task_id == task.id).order_by(Run.seq))).scalars().all()

    async def to_read(self, task: Task, res: RepoResource) -> TaskRead:
        agent = await self.session.get(Account, task.agent_id)
        starter = await self.session.get(Account, task.started_by_id) if task.started_by_id else None
        runs = await self.runs(task)
        from tasks import approvals  # approvals builds on this module

        parked = await approvals.pending_for(self.session, task.id) if task.state == TaskState.BLOCKED else None
        merger = await self.session.get(Account, task.merged_by_id) if task.merged_by_id else None
        return TaskRead(
            merge_strategy=task.merge_strategy or None,
            merged_sha=task.merged_sha or None,
            merged_by=merger.login if merger else None,
            merged_at=task.merged_at,
            pending_approval=await approvals.to_read(self.session, parked) if parked is not None else None,
            number=task.number,
            repository=res.full_name,
            title=task.title,
            goal=task.goal,
            state=task.state,
            runtime=task.runtime,
            command=task.command,
            agent=agent.login if agent else "",
            started_by=starter.login if starter else None,
            base=task.base,
            branch=task.branch,
            base_sha=task.base_sha,
            head_sha=task.head_sha,
            head_is_wip=task.head_is_wip,
            summary=task.summary,
            error=task.error,
            failure_reason=task.failure_reason or None,
            question=task.question,
            queued_message=task.queued_message,
            queue_position=await queue_position(self.session, task),
            html_url=f"{self.base_url}/{res.full_name}/tasks/{task.number}",
            created_at=task.created_at,
            updated_at=task.updated_at,
            runs=[
                RunRead(
                    number=r.seq,
                    kind=r.kind,
                    state=r.state,
                    exit_code=r.exit_code,
                    error=r.error,
                    failure_reason=r.failure_reason or None,
                    turns=r.turns,
                    prompt_tokens=r.prompt_tokens,
                    completion_tokens=r.completion_tokens,
                    container_id=r.container_id,
                    start_sha=r.start_sha,
                    end_sha=r.end_sha,
                    skipped=[{"path": str(s.get("path", "")), "reason": str(s.get("reason", ""))} for s in r.skipped],
                    created_at=r.created_at,
                    started_at=r.started_at,
                    finished_at=r.finished_at,
                )
                for r in runs
            ],
        )

    # --- actions ------------------------------------------------------------------------------

    async def precheck_prompt(self, ctx: GateContext, text: str, kind: PromptKind) -> PromptCheck:
        """Ask the policy now, outside the write transaction; the dispatcher logs the call itself."""
        decision = await self.gate.user_prompt_submit(ctx, prompt=text, kind=kind, session=None)
        result = self._obey(decision, text)
        return PromptCheck(task_uuid=ctx.task_uuid, number=ctx.task_number, kind=kind, original=text, result=result)

    async def _check_prompt(
        self, ctx: GateContext, text: str, kind: PromptKind, checked: PromptCheck | None = None
    ) -> str:
        if checked is not None and (checked.task_uuid, checked.number, checked.kind, checked.original) == (
            ctx.task_uuid,
            ctx.task_number,
            kind,
            text,
        ):
            return checked.result
        # Not prechecked (or something changed): ask now, in the request's transaction.
        decision = await self.gate.user_prompt_submit(ctx, prompt=text, kind=kind, session=self.session)
        return self._obey(decision, text)

    @staticmethod
    def _obey(decision: Any, text: str) -> str:
        if decision.failed:
            raise BadGateway(decision.reason, code="hook_dispatch_failed")
        if decision.decision != "allow":
            raise Forbidden(decision.user_message or decision.reason or "a policy refused this", code="policy_denied")
        if decision.input_override and isinstance(decision.input_override.get("prompt"), str):
            return str(decision.input_override["prompt"])
        return text

    async def _agent(self, res: RepoResource, login: str) -> Account:
        from forge import accounts

        agent = await accounts.get_by_login(self.session, login)
        if agent is None or not agent.is_bot or agent.disabled:
            raise InvalidInput(f"{login!r} is not an active bot account", code="invalid_agent")
        agent_principal = Principal(account_id=agent.id, login=agent.login, type="Bot", via="session")
        agent_res = await resource_for(self.session, res.repo, agent_principal)
        role = effective_role(agent_principal, agent_res)
        if role is None or role < Role.WRITE:
            raise InvalidInput(f"the bot {agent.login!r} needs write access to {res.full_name}", code="invalid_agent")
        return agent

    async def _new_run(self, task: Task, kind: RunKind, prompt: str, actor: Actor) -> Run:
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
            requested_by_id=actor.principal.account_id,
            skipped=[],
        )
        self.session.add(run)
        await self.session.flush()
        return run

    async def precheck_start(self, actor: Actor, res: RepoResource, data: TaskCreate) -> PromptCheck:
        """Validate a start and ask `user_prompt_submit` about its goal before any write, for the
        task the start will most likely create (a fresh uuid, the next number)."""
        task, agent = await self._prepare_start(actor, res, data)
        last = await self.session.get(TaskCounter, res.repo.id)
        task.number = (last.last_number if last is not None else 0) + 1
        task.uuid = str(uuid_mod.uuid4())
        ctx = gate_context(task, res.full_name, res.repo.uuid, self.base_url, actor.principal, agent.login)
        return await self.precheck_prompt(ctx, task.goal, "goal")

    async def start(
        self, actor: Actor, res: RepoResource, data: TaskCreate, *, checked: PromptCheck | None = None
    ) -> Task:
        task, agent = await self._prepare_start(actor, res, data)
        task.number = await _allocate_number(self.session, res.repo.id)
        task.branch = f"agent/{task.number}-{slugify(task.title)}"
        if checked is not None:
            task.uuid = checked.task_uuid
        ctx = gate_context(task, res.full_name, res.repo.uuid, self.base_url, actor.principal, agent.login)
        goal = await self._check_prompt(ctx, task.goal, "goal", checked)
        task.goal = goal
        self.session.add(task)
        await self.session.flush()
        number, base, runtime = task.number, task.base, task.runtime
        run = await self._new_run(task, RunKind.START, goal, actor)
        await transcript.append(
            self.session,
            task.id,
            [
                Pending(
                    kind="prompt",
                    payload=Prompt(text=goal, source="start", author=actor.principal.login),
                    run_id=run.id,
                )
            ],
        )
        audit.record(
            self.session,
            actor,
            "task.start",
            f"{res.full_name}#{number}",
            runtime=runtime,
            agent=agent.login,
            base=base,
        )
        await publish(
            self.session, self.bus, "task.created", task, res.repo, base_url=self.base_url, actor=actor.principal
        )
        await publish(
            self.session,
            self.bus,
            "task.state_changed",
            task,
            res.repo,
            base_url=self.base_url,
            actor=actor.principal,
            run=run,
            data={"from": None, "to": "queued", "queue_position": await queue_position(self.session, task)},
        )
        return task

    async def _prepare_start(self, actor: Actor, res: RepoResource, data: TaskCreate) -> tuple[Task, Account]:
        """Everything a start checks, and the task it would create (not added, no number yet)."""
        require(actor.principal, Action.TASK_WRITE, res)
        if actor.principal.account_id is None:
            raise Forbidden("sign in or send a token")
        goal = data.goal.strip()
        if not goal:
            raise InvalidInput("the goal is required", code="goal_required")
        runtime = data.runtime or ("command" if data.command is not None else "builtin")
        command: str | list[str] | None = None
        if runtime == "command":
            try:
                command = data.command if isinstance(data.command, str) else list(data.command or [])
                argv_of(command)
            except ValueError:
                raise InvalidInput("the command runtime needs a command", code="command_required") from None
            if isinstance(command, list) and any("\x00" in a for a in command):
                raise InvalidInput("command arguments may not contain NUL", code="invalid_command")
        else:
            if data.command is not None:
                raise InvalidInput("`command` is for the command runtime", code="invalid_command")
            effective = await repo_settings.effective(self.session, self.settings, res.repo.id)
            if not (effective.model_base_url and effective.model_name):
                raise InvalidInput(
                    "the builtin runtime needs a model endpoint (FORGEHAND_MODEL_BASE_URL, FORGEHAND_MODEL_NAME); "
                    "use the command runtime or configure one",
                    code="model_not_configured",
                )
        agent = await self._agent(res, data.agent)
        base = data.base.strip() or res.repo.default_branch
        try:
            validate_branch_name(base)
            resolved = await self.store.read(res.key, resolve_ref, base)
        except (RefNotFound, InvalidRefName):
            raise InvalidInput(f"the base branch {base!r} does not exist", code="base_not_found") from None
        if resolved.kind != "branch":
            raise InvalidInput(f"{base!r} is not a branch", code="base_not_found")
        title = data.title.strip() or title_from_goal(goal)
        task = Task(
            repo_id=res.repo.id,
            number=0,
            title=title,
            goal=goal,
            runtime=runtime,
            command=command,
            agent_id=agent.id,
            started_by_id=actor.principal.account_id,
            base=base,
            branch="",
            base_sha=resolved.sha,
            head_sha="",
            state=TaskState.QUEUED,
            conversation=[],
        )
        return task, agent

    async def _gate_ctx(self, task: Task, res: RepoResource, actor: Actor) -> GateContext:
        agent = await self.session.get(Account, task.agent_id)
        return gate_context(
            task, res.full_name, res.repo.uuid, self.base_url, actor.principal, agent.login if agent else ""
        )

    async def _lock(self, task: Task) -> Task:
        """Re-read the task row under a lock (PostgreSQL FOR UPDATE; SQLite writers are serialized)."""
        return (
            await self.session.execute(
                select(Task).where(Task.id == task.id).with_for_update().execution_options(populate_existing=True)
            )
        ).scalar_one()

    async def _enqueue(self, actor: Actor, res: RepoResource, task: Task, kind: RunKind, prompt: str) -> Run:
        run = await self._new_run(task, kind, prompt, actor)
        task.question = ""
        task.error = ""
        task.failure_reason = ""
        await set_state(
            self.session,
            self.bus,
            task,
            res.repo,
            TaskState.QUEUED,
            base_url=self.base_url,
            actor=actor.principal,
            run=run,
        )
        return run

    async def _valid_message(self, task: Task, data: MessageCreate) -> str:
        body = data.body.strip()
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
        body = data.body.strip()
        if not body:
            raise InvalidInput("the answer is empty", code="body_required")
        if task.state != TaskState.BLOCKED or not task.question:
            raise InvalidState("the task has no pending question", code="no_pending_question")
        return body

    async def precheck(
        self, actor: Actor, res: RepoResource, task: Task, data: MessageCreate, kind: PromptKind
    ) -> PromptCheck:
        """Validate a message or an answer and ask `user_prompt_submit` before any write."""
        require(actor.principal, Action.TASK_WRITE, res)
        body = await self._valid_message(task, data) if kind == "message" else self._valid_answer(task, data)
        return await self.precheck_prompt(await self._gate_ctx(task, res, actor), body, kind)

    async def message(
        self, actor: Actor, res: RepoResource, task: Task, data: MessageCreate, *, checked: PromptCheck | None = None
    ) -> Task:
        require(actor.principal, Action.TASK_WRITE, res)
        task = await self._lock(task)
        body = await self._valid_message(task, data)
        state = TaskState(task.state)
        body = await self._check_prompt(await self._gate_ctx(task, res, actor), body, "message", checked)
        target = f"{res.full_name}#{task.number}"
        if state.is_active:
            task.queued_message = f"{task.queued_message}\n\n{body}" if task.queued_message else body
            await transcript.append(
                self.session,
                task.id,
                [
                    Pending(
                        kind="notice", payload=Notice(text=f"{actor.principal.login} queued a message for the next run")
                    )
                ],
            )
            audit.record(self.session, actor, "task.message", target, queued=True)
            return task
        run = await self._enqueue(actor, res, task, RunKind.MESSAGE, body)
        await transcript.append(
            self.session,
            task.id,
            [
                Pending(
                    kind="prompt",
                    payload=Prompt(text=body, source="message", author=actor.principal.login),
                    run_id=run.id,
                )
            ],
        )
        audit.record(self.session, actor, "task.message", target, queued=False)
        return task

    async def _approval_pending(self, task: Task) -> bool:
        found = await self.session.execute(
            select(Approval.id).where(Approval.task_id == task.id, Approval.state == "pending").limit(1)
        )
        return found.first() is not None

    async def answer(
        self, actor: Actor, res: RepoResource, task: Task, data: MessageCreate, *, checked: PromptCheck | None = None
    ) -> Task:
        require(actor.principal, Action.TASK_WRITE, res)
        task = await self._lock(task)
        body = self._valid_answer(task, data)
        body = await self._check_prompt(await self._gate_ctx(task, res, actor), body, "answer", checked)
        run = await self._enqueue(actor, res, task, RunKind.ANSWER, body)
        await transcript.append(
            self.session,
            task.id,
            [
                Pending(
                    kind="prompt",
                    payload=Prompt(text=body, source="answer", author=actor.principal.login),
                    run_id=run.id,
                )
            ],
        )
        audit.record(self.session, actor, "task.answer", f"{res.full_name}#{task.number}")
        return task

    async def retry(self, actor: Actor, res: RepoResource, task: Task) -> Task:
        require(actor.principal, Action.TASK_WRITE, res)
        task = await self._lock(task)
        if task.state not in (TaskState.FAILED, TaskState.STOPPED):
            raise InvalidState(
                f"only failed or stopped tasks can be retried (this one is {task.state})", code="invalid_task_state"
            )
        last = (
            await self.session.execute(select(Run).where(Run.task_id == task.id).order_by(Run.seq.desc()).limit(1))
        ).scalar_one_or_none()
        prompt = last.prompt if last is not None else task.goal
        run = await self._enqueue(actor, res, task, RunKind.RETRY, prompt)
        await transcript.append(
            self.session,
            task.id,
            [Pending(kind="notice", payload=Notice(text=f"{actor.principal.login} retried the task"), run_id=run.id)],
        )
        audit.record(self.session, actor, "task.retry", f"{res.full_name}#{task.number}")
        return task

    async def close(self, actor: Actor, res: RepoResource, task: Task) -> Task:
        require(actor.principal, Action.TASK_WRITE, res)
        task = await self._lock(task)
        if task.state == TaskState.CLOSED:
            return task
        await set_state(
            self.session, self.bus, task, res.repo, TaskState.CLOSED, base_url=self.base_url, actor=actor.principal
        )
        await transcript.append(
            self.session,
            task.id,
            [Pending(kind="notice", payload=Notice(text=f"{actor.principal.login} closed the task"))],
        )
        audit.record(self.session, actor, "task.close", f"{res.full_name}#{task.number}")
        return task

    def may_stop(self, principal: Principal, res: RepoResource, task: Task) -> bool:
        if principal.via == "internal":
            return True
        if principal.account_id is not None and principal.account_id in (task.started_by_id, task.agent_id):
            return True
        role = effective_role(principal, res)
        return role is not None and role >= Role.ADMIN

    async def request_stop(self, actor: Actor, res: RepoResource, task: Task) -> Run | None:
        """Stop: a queued or blocked task stops now; a running one is flagged for its worker.
        Returns the run that still has to end (the caller kills its sandbox and waits)."""
        require(actor.principal, Action.TASK_WRITE, res)
        if not self.may_stop(actor.principal, res, task):
            raise Forbidden("only the starter, the task's agent or a repository admin can stop a task")
        task = await self._lock(task)
        target = f"{res.full_name}#{task.number}"
        state = TaskState(task.state)
        if state is TaskState.STOPPED:
            return None  # idempotent
        if state not in (TaskState.QUEUED, TaskState.RUNNING, TaskState.BLOCKED):
            raise InvalidState(f"a {state.value} task is not running", code="invalid_task_state")
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
        audit.record(self.session, actor, "task.stop", target)
        await transcript.append(
            self.session,
            task.id,
            [Pending(kind="notice", payload=Notice(text=f"{actor.principal.login} stopped the task"))],
        )
        if pending is None:
            task.question = ""
            from tasks import approvals  # approvals builds on this module

            await approvals.cancel_pending(
                self.session, self.bus, task, res.repo, base_url=self.base_url, actor=actor.principal
            )
            await set_state(
                self.session, self.bus, task, res.repo, TaskState.STOPPED, base_url=self.base_url, actor=actor.principal
            )
        return pending
