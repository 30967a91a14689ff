"""Web pages of tasks: the repository's task list (with a start form), the task page (state, runs,
live transcript, question form, actions) and "my tasks". Same actions as the REST API."""

from typing import Annotated, Any

from litestar import Controller, Request, get, post
from litestar.params import FromPath, QueryParameter, URLEncodedBody
from litestar.response import Redirect, Template

from forge.deps import ActorDep, DbSession
from forge.errors import ForgeError, NotFound, Unauthenticated
from forge.pages import page
from tasks.core import transcript
from tasks.core.schemas import MessageCreate
from tasks.http.actions import Act, act_on_task, decide_approval, start_task
from tasks.http.deps import DEPENDENCIES, REPO_TASKS, RepoScope, RepoScopeDep, SystemDep, TaskScopeDep, task_system
from tasks.http.pages.common import or_form_error, repo_context, visible_json
from tasks.http.pages.forms import BodyForm, DecisionForm, StartForm, approval_decide, task_create
from tasks.services import rules

# The task page's forms post to /{number}/{action}.
PAGE_ACTIONS: dict[str, Act] = {
    "messages": "message",
    "answer": "answer",
    "retry": "retry",
    "close": "close",
    "stop": "stop",
}


async def list_page(
    request: Request[Any, Any, Any],
    scope: RepoScope,
    *,
    task_state: str | None = None,
    form: StartForm | None = None,
    error: str | None = None,
    status_code: int = 200,
) -> Template:
    svc, res = scope.svc, scope.res
    tasks = await svc.to_reads([(t, res) for t in await svc.list_tasks(res, state=task_state or None)])
    return page(
        request,
        "tasks/list.html",
        status_code=status_code,
        tasks=tasks,
        error=error,
        form=form or StartForm(),
        agents=await task_system(request.app.state).installed_agents(),
        **repo_context(res, scope.actor.principal, svc.base_url),
    )


class TaskPages(Controller):
    path = REPO_TASKS
    include_in_schema = False
    dependencies = DEPENDENCIES

    @get("/")
    async def list_tasks(
        self,
        request: Request[Any, Any, Any],
        repo_scope: RepoScopeDep,
        task_state: Annotated[str | None, QueryParameter(name="state")] = None,
    ) -> Template:
        return await list_page(request, repo_scope, task_state=task_state)

    @post("/")
    async def start(
        self, request: Request[Any, Any, Any], repo_scope: RepoScopeDep, data: URLEncodedBody[StartForm]
    ) -> Template | Redirect:
        async def again(exc: ForgeError) -> Template:
            return await list_page(request, repo_scope, form=data, error=exc.detail, status_code=exc.status)

        read = await or_form_error(start_task(repo_scope, task_create(data)), again)
        if isinstance(read, Template):
            return read
        return Redirect(f"/{read.repository}/tasks/{read.number}", status_code=303)

    @get("/{number:str}")
    async def task_page(self, request: Request[Any, Any, Any], task_scope: TaskScopeDep) -> Template:
        svc, res, task = task_scope.svc, task_scope.res, task_scope.task
        events = await transcript.read(task_scope.session, task.id, after=0, limit=5000)
        read = await svc.to_read(task, res)
        parked = read.pending_approval
        principal = task_scope.actor.principal
        return page(
            request,
            "tasks/task.html",
            task=read,
            # Autoescaped as text: the person sees the exact input, `<` and all.
            approval_input=visible_json(parked.tool_input) if parked else "",
            events=events,
            last_seq=events[-1].seq if events else 0,
            may_stop=rules.may_stop(principal, res, task),
            **repo_context(res, principal, svc.base_url),
        )

    @post("/{number:str}/{action:str}")
    async def act(self, task_scope: TaskScopeDep, action: FromPath[str], data: URLEncodedBody[BodyForm]) -> Redirect:
        act = PAGE_ACTIONS.get(action)
        if act is None:
            raise NotFound("no such action")
        # `stop` here only asks: the page shows "stopping" until the worker settles.
        read = await act_on_task(task_scope, act, MessageCreate(body=data.body[:20_000]))
        return Redirect(f"/{read.repository}/tasks/{task_scope.number}", status_code=303)

    @post("/{number:str}/approvals/{approval_id:str}")
    async def decide(
        self, task_scope: TaskScopeDep, approval_id: FromPath[str], data: URLEncodedBody[DecisionForm]
    ) -> Redirect:
        await decide_approval(task_scope, approval_id, approval_decide(data))
        return Redirect(f"/{task_scope.owner}/{task_scope.name}/tasks/{task_scope.number}", status_code=303)


class MyTaskPages(Controller):
    include_in_schema = False
    dependencies = DEPENDENCIES

    @get("/tasks")
    async def mine(
        self, request: Request[Any, Any, Any], db_session: DbSession, actor: ActorDep, task_system: SystemDep
    ) -> Template:
        if actor.principal.account_id is None:
            raise Unauthenticated("sign in first")
        svc = task_system.service(db_session)
        return page(request, "tasks/mine.html", tasks=await svc.to_reads(await svc.list_for_user(actor.principal)))
