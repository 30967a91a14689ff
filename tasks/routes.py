"""REST and SSE for tasks. Thin: parse, authorize (`repositories.load` + the service's checks),
call the service, return a schema."""

import time
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

import msgspec
from litestar import Controller, Request, get, post
from litestar.datastructures import State
from litestar.params import FromPath, JSONBody, QueryParameter
from litestar.response import Stream
from sqlalchemy import func, select

from forge import repositories
from forge.access import Action
from forge.audit import Actor
from forge.db import Database
from forge.deps import ActorDep, DatabaseDep, DbSession
from forge.errors import Unauthenticated
from forge.repositories import RepoResource
from tasks import transcript
from tasks.models import Run, Task
from tasks.schemas import MessageCreate, TaskCreate, TaskRead, TranscriptPage
from tasks.service import TaskService, parse_number
from tasks.states import RunState, TaskState
from tasks.system import TaskSystem

TASKS = "/api/v1/repos/{owner:str}/{name:str}/tasks"
TASK = TASKS + "/{number:str}"
HEARTBEAT_SECONDS = 15.0
STOP_WAIT_SECONDS = 60.0

_json = msgspec.json.Encoder()


def task_system(state: State) -> TaskSystem:
    system: TaskSystem = state.tasks
    return system


def service_for(session: Any, state: State) -> TaskService:
    system = task_system(state)
    return TaskService(session, bus=system.bus, store=system.store, settings=system.settings, gate=system.gate)


async def _load(session: Any, actor: Actor, owner: str, name: str, action: Action = Action.TASK_READ) -> RepoResource:
    return await repositories.load(session, actor.principal, owner, name, action)


async def load_task(
    session: Any, state: State, actor: Actor, owner: str, name: str, number: int
) -> tuple[RepoResource, TaskService, Task]:
    """The repository (404 below the role that reads tasks), the service on `session`, the task."""
    res = await repositories.load(session, actor.principal, owner, name, Action.TASK_READ)
    svc = service_for(session, state)
    return res, svc, await svc.get(res, number)


async def start_task(
    db: Database, state: State, actor: Actor, owner: str, name: str, data: TaskCreate
) -> tuple[TaskRead, int]:
    """Start a task (REST and the start form): the goal's policy check runs before the write
    transaction (see PromptCheck). Returns the task and its id."""
    async with db.session() as s:
        res = await _load(s, actor, owner, name, Action.TASK_WRITE)
        checked = await service_for(s, state).precheck_start(actor, res, data)
    async with db.session(write=True) as s:
        res = await _load(s, actor, owner, name, Action.TASK_WRITE)
        svc = service_for(s, state)
        task = await svc.start(actor, res, data, checked=checked)
        return await svc.to_read(task, res), task.id


Act = Literal["message", "answer", "retry", "close", "stop"]


async def act_on_task(
    db: Database, state: State, actor: Actor, owner: str, name: str, n: int, action: Act, body: MessageCreate | None
) -> tuple[TaskRead, int]:
    """One action on a task (REST and the task page). A message's or an answer's policy check runs
    before the write transaction (see PromptCheck); `stop` only asks (the worker settles it)."""
    checked = None
    if action in ("message", "answer"):
        assert body is not None
        async with db.session() as s:
            res, svc, task = await load_task(s, state, actor, owner, name, n)
            checked = await svc.precheck(actor, res, task, body, "message" if action == "message" else "answer")
    async with db.session(write=True) as s:
        # Tasks are invisible below the write role (404); the service then checks the write action.
        res, svc, task = await load_task(s, state, actor, owner, name, n)
        if action == "message":
            assert body is not None
            task = await svc.message(actor, res, task, body, checked=checked)
        elif action == "answer":
            assert body is not None
            task = await svc.answer(actor, res, task, body, checked=checked)
        elif action == "retry":
            task = await svc.retry(actor, res, task)
        elif action == "close":
            task = await svc.close(actor, res, task)
        else:
            await svc.request_stop(actor, res, task)
        return await svc.to_read(task, res), task.id


async def wait_for_stop(db: Database, system: TaskSystem, task_id: int, timeout: float) -> None:  # noqa: ASYNC109
    """Until no run of the task is running (its worker removed the sandbox before settling)."""
    deadline = time.monotonic() + timeout
    with system.hub.waiter(task_id) as waiter:
        while time.monotonic() < deadline:
            async with db.session() as s:
                running = (
                    await s.execute(
                        select(func.count(Run.id)).where(Run.task_id == task_id, Run.state == RunState.RUNNING)
                    )
                ).scalar_one()
            if not running:
                return
            await waiter.wait(min(1.0, max(0.0, deadline - time.monotonic())))


class TaskController(Controller):
    tags = ["tasks"]

    @post(TASKS, summary="Start a task: an agent works on a goal in a sandbox", status_code=201)
    async def start(
        self,
        db: DatabaseDep,
        actor: ActorDep,
        state: State,
        owner: FromPath[str],
        name: FromPath[str],
        data: JSONBody[TaskCreate],
    ) -> TaskRead:
        read, task_id = await start_task(db, state, actor, owner, name, data)
        task_system(state).changed(task_id)
        return read

    @get(TASKS, summary="Tasks of a repository")
    async def list_tasks(
        self,
        db_session: DbSession,
        actor: ActorDep,
        state: State,
        owner: FromPath[str],
        name: FromPath[str],
        task_state: Annotated[str | None, QueryParameter(name="state")] = None,
    ) -> list[TaskRead]:
        res = await _load(db_session, actor, owner, name)
        svc = service_for(db_session, state)
        return [await svc.to_read(t, res) for t in await svc.list_tasks(res, state=task_state)]

    @get(TASK, summary="A task")
    async def get_task(
        self,
        db_session: DbSession,
        actor: ActorDep,
        state: State,
        owner: FromPath[str],
        name: FromPath[str],
        number: FromPath[str],
    ) -> TaskRead:
        n = parse_number(number)
        res, svc, task = await load_task(db_session, state, actor, owner, name, n)
        return await svc.to_read(task, res)

    async def _act(
        self, db: Database, actor: Actor, state: State, owner: str, name: str, number: str, action: Act, body: Any
    ) -> TaskRead:
        read, task_id = await act_on_task(db, state, actor, owner, name, parse_number(number), action, body)
        task_system(state).changed(task_id)
        return read

    @post(TASK + "/messages", summary="Send the agent a message (queued while a run is active)", status_code=200)
    async def message(
        self,
        db: DatabaseDep,
        actor: ActorDep,
        state: State,
        owner: FromPath[str],
        name: FromPath[str],
        number: FromPath[str],
        data: JSONBody[MessageCreate],
    ) -> TaskRead:
        return await self._act(db, actor, state, owner, name, number, "message", data)

    @post(TASK + "/answer", summary="Answer the agent's pending question", status_code=200)
    async def answer(
        self,
        db: DatabaseDep,
        actor: ActorDep,
        state: State,
        owner: FromPath[str],
        name: FromPath[str],
        number: FromPath[str],
        data: JSONBody[MessageCreate],
    ) -> TaskRead:
        return await self._act(db, actor, state, owner, name, number, "answer", data)

    @post(TASK + "/retry", summary="Retry a failed or stopped task", status_code=200)
    async def retry(
        self,
        db: DatabaseDep,
        actor: ActorDep,
        state: State,
        owner: FromPath[str],
        name: FromPath[str],
        number: FromPath[str],
    ) -> TaskRead:
        return await self._act(db, actor, state, owner, name, number, "retry", None)

    @post(TASK + "/close", summary="Close a task", status_code=200)
    async def close(
        self,
        db: DatabaseDep,
        actor: ActorDep,
        state: State,
        owner: FromPath[str],
        name: FromPath[str],
        number: FromPath[str],
    ) -> TaskRead:
        return await self._act(db, actor, state, owner, name, number, "close", None)

    @post(
        TASK + "/stop",
        summary="Stop a task: kills its sandbox; answers when the container is gone (idempotent)",
        status_code=200,
    )
    async def stop(
        self,
        db: DatabaseDep,
        actor: ActorDep,
        state: State,
        owner: FromPath[str],
        name: FromPath[str],
        number: FromPath[str],
    ) -> TaskRead:
        n = parse_number(number)
        system = task_system(state)
        async with db.session(write=True) as s:
            res, svc, task = await load_task(s, state, actor, owner, name, n)
            pending = await svc.request_stop(actor, res, task)
            task_id = task.id
        system.changed(task_id)
        if pending is not None:
            await wait_for_stop(db, system, task_id, STOP_WAIT_SECONDS)
        async with db.session() as s:
            res, svc, task = await load_task(s, state, actor, owner, name, n)
            return await svc.to_read(task, res)

    @get(TASK + "/transcript", summary="The transcript, paginated by sequence number")
    async def transcript_page(
        self,
        db_session: DbSession,
        actor: ActorDep,
        state: State,
        owner: FromPath[str],
        name: FromPath[str],
        number: FromPath[str],
        after: Annotated[int, QueryParameter(name="after", ge=0, le=2**31)] = 0,
        limit: Annotated[int, QueryParameter(name="limit", ge=1, le=1000)] = 200,
    ) -> TranscriptPage:
        n = parse_number(number)
        _res, _, task = await load_task(db_session, state, actor, owner, name, n)
        events = await transcript.read(db_session, task.id, after=after, limit=limit)
        next_after = events[-1].seq if events else after
        return TranscriptPage(events=events, next_after=next_after, complete=next_after >= task.last_seq)

    @get(TASK + "/events", summary="The live transcript (Server-Sent Events; resumes from Last-Event-ID)")
    async def events(
        self,
        request: Request[Any, Any, Any],
        db: DatabaseDep,
        actor: ActorDep,
        state: State,
        owner: FromPath[str],
        name: FromPath[str],
        number: FromPath[str],
        after: Annotated[int | None, QueryParameter(name="after", ge=0, le=2**31)] = None,
    ) -> Stream:
        n = parse_number(number)
        async with db.session() as s:
            _res, _, task = await load_task(s, state, actor, owner, name, n)
            task_id = task.id
        start = after or 0
        last_event_id = request.headers.get("last-event-id", "").strip()
        if last_event_id.isdigit() and len(last_event_id) < 10:
            start = max(start, int(last_event_id))
        return Stream(
            sse_stream(db, task_system(state), task_id, start),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )


def _frame(ev: transcript.EventRead) -> bytes:
    return b"id: %d\nevent: %s\ndata: %s\n\n" % (ev.seq, ev.kind.encode(), _json.encode(ev))


async def sse_stream(
    db: Database,
    system: TaskSystem,
    task_id: int,
    after: int,
    *,
    heartbeat: float = HEARTBEAT_SECONDS,
    poll: float = 1.0,
) -> AsyncIterator[bytes]:
    """Replay from the database after `after`, then follow; end once the task rests and all is sent."""
    last = after
    last_write = time.monotonic()
    seen_state = ""
    yield b"retry: 2000\n\n"
    with system.hub.waiter(task_id) as waiter:
        while True:
            async with db.session() as s:
                # State first: a resting state is committed after every event of the run that ended.
                task_state = await s.get(Task, task_id, populate_existing=True)
                resting = task_state is None or TaskState(task_state.state).is_resting
                events = await transcript.read(s, task_id, after=last, limit=1000)
            if task_state is not None and task_state.state != seen_state and not resting:
                # No id: a state is not a transcript event (resuming replays events, not states).
                seen_state = task_state.state
                yield b"event: state\ndata: %s\n\n" % _json.encode({"state": seen_state})
            if events:
                yield b"".join(_frame(ev) for ev in events)
                last = events[-1].seq
                last_write = time.monotonic()
                if len(events) == 1000:
                    continue
            if resting:
                state_name = task_state.state if task_state is not None else "gone"
                yield b"event: end\ndata: %s\n\n" % _json.encode({"state": state_name, "last_seq": last})
                return
            remaining = heartbeat - (time.monotonic() - last_write)
            if remaining <= 0:
                yield b": heartbeat\n\n"
                last_write = time.monotonic()
                continue
            await waiter.wait(min(poll, remaining))


class UserTaskController(Controller):
    tags = ["tasks"]

    @get("/api/v1/user/tasks", summary="My tasks: started by me or worked on by me, across repositories")
    async def my_tasks(self, db_session: DbSession, actor: ActorDep, state: State) -> list[TaskRead]:
        if actor.principal.account_id is None:
            raise Unauthenticated("sign in or send a token")
        svc = service_for(db_session, state)
        return [await svc.to_read(t, res) for t, res in await svc.list_for_user(actor.principal)]


__all__ = ["TaskController", "UserTaskController", "sse_stream", "wait_for_stop"]
