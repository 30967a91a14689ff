"""Web pages of tasks: the repository's task list (with a start form), the task page (state, runs,
live transcript, question form, actions) and "my tasks". Same service as the REST API."""

import json
import unicodedata
from typing import Annotated, Any, Literal

import msgspec
from litestar import Controller, Request, get, post
from litestar.datastructures import State
from litestar.params import FromPath, QueryParameter, URLEncodedBody
from litestar.response import Redirect, Template

from forge import repositories
from forge.access import Action, can
from forge.deps import ActorDep, DatabaseDep, DbSession
from forge.errors import ForgeError, InvalidInput, NotFound, Unauthenticated
from forge.pages import page
from tasks import transcript
from tasks.approval_routes import decide_approval
from tasks.routes import Act, act_on_task, load_task, service_for, start_task
from tasks.schemas import ApprovalDecide, MessageCreate, TaskCreate
from tasks.service import parse_number

REPO_TASKS = "/{owner:str}/{name:str}/tasks"


class StartForm(msgspec.Struct, kw_only=True):
    goal: str = ""
    agent: str = ""
    runtime: str = "command"
    command: str = ""
    base: str = ""
    title: str = ""
    csrf_token: str = ""


class BodyForm(msgspec.Struct, kw_only=True):
    body: str = ""
    csrf_token: str = ""


class DecisionForm(msgspec.Struct, kw_only=True):
    decision: str = ""
    reason: str = ""
    input_hash: str = ""
    csrf_token: str = ""


class ActionForm(msgspec.Struct, kw_only=True):
    csrf_token: str = ""


def _repo_ctx(res: Any, principal: Any, base_url: str) -> dict[str, Any]:
    return {
        "repo": repositories.to_read(res, principal, base_url),
        "can_admin": can(principal, Action.REPO_ADMIN, res),
        "can_write": can(principal, Action.TASK_WRITE, res),
    }


def visible_json(value: Any) -> str:
    """JSON for a person to approve: readable (non-ASCII text as is), but characters that are
    invisible or change the text's direction are shown escaped, so they cannot disguise a command."""
    text = json.dumps(value, indent=2, ensure_ascii=False)
    hidden = ("Cc", "Cf", "Co", "Cs", "Zl", "Zp")
    return "".join(f"\\u{ord(ch):04x}" if ch != "\n" and unicodedata.category(ch) in hidden else ch for ch in text)


# The task page's forms post to /{number}/{action}.
PAGE_ACTIONS: dict[str, Act] = {
    "messages": "message",
    "answer": "answer",
    "retry": "retry",
    "close": "close",
    "stop": "stop",
}


class TaskPages(Controller):
    path = REPO_TASKS
    include_in_schema = False

    @get("/")
    async def list_page(
        self,
        request: Request[Any, Any, Any],
        db_session: DbSession,
        actor: ActorDep,
        state: State,
        owner: FromPath[str],
        name: FromPath[str],
        task_state: Annotated[str | None, QueryParameter(name="state")] = None,
    ) -> Template:
        res = await repositories.load(db_session, actor.principal, owner, name, Action.TASK_READ)
        svc = service_for(db_session, state)
        tasks = [await svc.to_read(t, res) for t in await svc.list_tasks(res, state=task_state or None)]
        return page(
            request,
            "tasks/list.html",
            tasks=tasks,
            error=None,
            form=StartForm(),
            **_repo_ctx(res, actor.principal, svc.base_url),
        )

    @post("/")
    async def start(
        self,
        request: Request[Any, Any, Any],
        db: DatabaseDep,
        actor: ActorDep,
        state: State,
        owner: FromPath[str],
        name: FromPath[str],
        data: URLEncodedBody[StartForm],
    ) -> Template | Redirect:
        command: str | None = data.command if data.runtime == "command" else None
        create = TaskCreate(
            goal=data.goal[:20_000],
            agent=data.agent.strip()[:40] or "-",
            runtime="command" if data.runtime == "command" else "builtin",
            command=command,
            base=data.base.strip()[:255],
            title=data.title.strip()[:200],
        )
        try:
            read, task_id = await start_task(db, state, actor, owner, name, create)
        except ForgeError as exc:
            if exc.status == 404:
                raise
            async with db.session() as s:
                res = await repositories.load(s, actor.principal, owner, name, Action.TASK_READ)
                svc = service_for(s, state)
                tasks = [await svc.to_read(t, res) for t in await svc.list_tasks(res)]
                context = _repo_ctx(res, actor.principal, svc.base_url)
            return page(
                request, "tasks/list.html", status_code=exc.status, tasks=tasks, error=exc.detail, form=data, **context
            )
        state.tasks.changed(task_id)
        return Redirect(f"/{read.repository}/tasks/{read.number}", status_code=303)

    @get("/{number:str}")
    async def task_page(
        self,
        request: Request[Any, Any, Any],
        db_session: DbSession,
        actor: ActorDep,
        state: State,
        owner: FromPath[str],
        name: FromPath[str],
        number: FromPath[str],
    ) -> Template:
        n = parse_number(number)
        res, svc, task = await load_task(db_session, state, actor, owner, name, n)
        events = await transcript.read(db_session, task.id, after=0, limit=5000)
        read = await svc.to_read(task, res)
        parked = read.pending_approval
        return page(
            request,
            "tasks/task.html",
            task=read,
            # Autoescaped as text: the person sees the exact input, `<` and all.
            approval_input=visible_json(parked.tool_input) if parked else "",
            events=events,
            last_seq=events[-1].seq if events else 0,
            may_stop=svc.may_stop(actor.principal, res, task),
            **_repo_ctx(res, actor.principal, svc.base_url),
        )

    @post("/{number:str}/{action:str}")
    async def act(
        self,
        request: Request[Any, Any, Any],
        db: DatabaseDep,
        actor: ActorDep,
        state: State,
        owner: FromPath[str],
        name: FromPath[str],
        number: FromPath[str],
        action: FromPath[str],
        data: URLEncodedBody[BodyForm],
    ) -> Redirect:
        n = parse_number(number)
        act = PAGE_ACTIONS.get(action)
        if act is None:
            raise NotFound("no such action")
        # `stop` here only asks: the page shows "stopping" until the worker settles.
        read, task_id = await act_on_task(db, state, actor, owner, name, n, act, MessageCreate(body=data.body[:20_000]))
        state.tasks.changed(task_id)
        return Redirect(f"/{read.repository}/tasks/{n}", status_code=303)

    @post("/{number:str}/approvals/{approval_id:str}")
    async def decide(
        self,
        db: DatabaseDep,
        actor: ActorDep,
        state: State,
        owner: FromPath[str],
        name: FromPath[str],
        number: FromPath[str],
        approval_id: FromPath[str],
        data: URLEncodedBody[DecisionForm],
    ) -> Redirect:
        n = parse_number(number)
        if data.decision == "approve":
            choice: Literal["approve", "deny"] = "approve"
        elif data.decision == "deny":
            choice = "deny"
        else:
            raise InvalidInput("choose approve or deny", code="invalid_decision")
        decide = ApprovalDecide(decision=choice, reason=data.reason[:2000], input_hash=data.input_hash[:64])
        _, task_id = await decide_approval(db, state, actor, owner, name, n, approval_id, decide)
        state.tasks.changed(task_id)
        return Redirect(f"/{owner}/{name}/tasks/{n}", status_code=303)


class MyTaskPages(Controller):
    include_in_schema = False

    @get("/tasks")
    async def mine(
        self, request: Request[Any, Any, Any], db_session: DbSession, actor: ActorDep, state: State
    ) -> Template:
        if actor.principal.account_id is None:
            raise Unauthenticated("sign in first")
        svc = service_for(db_session, state)
        tasks = [await svc.to_read(t, res) for t, res in await svc.list_for_user(actor.principal)]
        return page(request, "tasks/mine.html", tasks=tasks)
