"""Web pages of tasks: the repository's task list (with a start form), the task page (state, runs,
live transcript, question form, actions) and "my tasks". Same actions as the REST API."""

import asyncio
import dataclasses
from typing import Annotated, Any

from litestar import Controller, Request, get, post
from litestar.params import FromPath, QueryParameter, URLEncodedBody
from litestar.response import Redirect, Template

from forge.core.errors import ForgeError, NotFound
from forge.http.auth import signed_in
from forge.http.deps import ActorDep, DbSession
from forge.http.pages.common import page
from forge.http.pages.forms import NO_ERRORS, FormErrors, form_errors
from tasks.core import transcript
from tasks.core.schemas import GOAL_MAX, ApprovalRead, TaskRead, command_text
from tasks.http.actions import Act, act_on_task, decide_approval, start_task
from tasks.http.deps import REPO_TASKS, RepoScope, RepoScopeDep, SystemDep, TaskScope, TaskScopeDep, task_system
from tasks.http.pages import start_form, timeline, timeline_items, tool_approvals
from tasks.http.pages.common import (
    PAGE_DEPENDENCIES,
    egress_line,
    or_form_error,
    repo_context,
    usage_line,
    visible_json,
)
from tasks.http.pages.forms import (
    BODY_ALIASES,
    DECISION_ALIASES,
    START_ALIASES,
    BodyForm,
    DecisionForm,
    StartForm,
    approval_decide,
    message_create,
    task_create,
)
from tasks.http.pages.start_form import Place
from tasks.http.pages.status import ACTIVE_LINES, waiting_line
from tasks.run import gitops
from tasks.run.runtimes import RUNTIMES
from tasks.services import agents, custom_tools, inbox, rules
from tasks.services.approvals import ApprovalService
from tasks.services.subtasks import subtask_reads

# The task page renders this many events at most (the JSON transcript pages through all of them);
# the live page asks for the items after its last one this many at a time.
PAGE_EVENTS = 5000
FRAGMENT_EVENTS = 500
# Kinds newer producers add (the model gateway's calls, the egress proxy's refusals): the live
# page listens for them too.
EXTRA_KINDS = ("model_call", "egress_blocked")

# A task in these states may still be waiting on a question its agent asked.
ACTIVE_STATES = ("queued", "running", "blocked")

LIST_STATES = ("", "queued", "running", "blocked", "awaiting_review", "failed", "stopped", "merged", "closed")

# The task page's forms post to /{number}/{action}.
PAGE_ACTIONS: dict[str, Act] = {
    "messages": "message",
    "answer": "answer",
    "retry": "retry",
    "close": "close",
    "stop": "stop",
}


def run_number(raw: str | None) -> int | None:
    """The run selector's value: a run number, or None (all runs; anything else shows all too)."""
    return int(raw) if raw and raw.isascii() and raw.isdigit() and len(raw) < 9 else None


def of_run(events: list[transcript.EventRead], run: int | None) -> list[transcript.EventRead]:
    return events if run is None else [e for e in events if e.run == run]


def header_texts(read: TaskRead, subtasks: list[TaskRead]) -> dict[str, Any]:
    """The header's texts: the command as written (its lines kept), the summaries as the agent's
    markdown, sanitised (`code` as code). Markdown is CPU work: call in a worker thread."""
    return {
        "command_text": command_text(read.command),
        "summary_html": timeline_items.agent_markdown(read.summary) if read.summary else "",
        "subtask_summaries": {c.number: timeline_items.agent_markdown(c.summary) for c in subtasks if c.summary},
    }


async def timeline_of(scope: TaskScope, events: list[transcript.EventRead]) -> list[timeline_items.Item]:
    """The events as the timeline's items, with the task's approvals (a parked call shows what it
    waits for, or who decided it)."""
    approvals = await ApprovalService(scope.svc).list(scope.task) if events else []
    active = scope.task.state in ACTIVE_STATES
    return await asyncio.to_thread(timeline.build, events, approvals, active=active)


async def list_page(
    request: Request[Any, Any, Any],
    scope: RepoScope,
    *,
    task_state: str | None = None,
    form: StartForm | None = None,
    errors: FormErrors = NO_ERRORS,
    status_code: int = 200,
    on_pull_request: int | None = None,
) -> Template:
    svc, res = scope.svc, scope.res
    tasks = await svc.to_reads([(t, res) for t in await svc.list_tasks(res, state=task_state or None)])
    principal = scope.actor.principal
    context = repo_context(res, principal, svc.base_url)
    options = runtimes = acp = None
    agent_tools: list[Any] = []
    if rules.may_start(principal, res):
        options = await agents.start_options(scope.session, svc.settings, res, RUNTIMES, principal.account_id)
        registry = await task_system(request.app.state).agent_registry()
        place = Place(repo=res.full_name, can_admin=context["can_admin"])
        runtimes = start_form.runtime_choices(options, registry, place)
        acp = start_form.acp_choices(options, registry, place)
        agent_tools = await custom_tools.for_agents(scope.session, principal, res)
    # The API's default runtime is builtin; the form picks it only when it can run here.
    ready = {c.value for c in runtimes or [] if c.ready}
    chosen = form or StartForm(
        agent=options.agents[0] if options and len(options.agents) == 1 else "",
        runtime="builtin" if "builtin" in ready else "command",
        agent_command=next((c.value for c in acp or [] if c.ready), ""),
        on_pull_request=str(on_pull_request or ""),
    )
    return page(
        request,
        "tasks/list.html",
        status_code=status_code,
        tasks=tasks,
        task_state=task_state or "",
        states=LIST_STATES,
        errors=errors,
        form=chosen,
        options=options,
        runtimes=runtimes,
        acp_agents=acp,
        agent_tools=agent_tools,
        goal_max=GOAL_MAX,
        **context,
    )


async def task_view(
    request: Request[Any, Any, Any], scope: TaskScope, run_filter: int | None, status_code: int = 200, **refused: Any
) -> Template:
    """The task page. `refused`: a refused form's `errors` and what was `typed` into it."""
    svc, res, task = scope.svc, scope.res, scope.task
    events = await transcript.read(scope.session, task.id, after=0, limit=PAGE_EVENTS)
    read = await svc.to_read(task, res)
    parked = read.pending_approval
    principal = scope.actor.principal
    branch_exists = bool(read.head_sha) and read.head_sha != read.base_sha
    if not branch_exists and read.head_sha:  # a pushed branch, or one recovery left, still shows
        branch_exists = await svc.store.read(res.key, gitops.branch_sha, read.branch) is not None
    subtasks = await subtask_reads(svc, res, task) if read.subtasks else []
    return page(
        request,
        "tasks/task.html",
        status_code=status_code,
        task=read,
        **await asyncio.to_thread(header_texts, read, subtasks),
        # Autoescaped as text: the person sees the exact input, `<` and all.
        approval_input=visible_json(parked.tool_input) if parked else "",
        items=await timeline_of(scope, of_run(events, run_filter)),
        event_count=len(events),
        truncated=len(events) >= PAGE_EVENTS,
        run_filter=run_filter,
        kinds=" ".join(dict.fromkeys((*transcript.KINDS, *EXTRA_KINDS))),
        last_seq=events[-1].seq if events else 0,
        waiting=waiting_line(read, task, principal, res),
        live_lines=ACTIVE_LINES,
        branch_exists=branch_exists,
        usage_line=usage_line(read),
        egress_line=egress_line(read),
        may_stop=rules.may_stop(principal, res, task),
        subtasks=subtasks,
        # Custom tool calls waiting for a person: a card each (`tasks/_tool_run_card.html`).
        tool_run_cards=await tool_approvals.waiting_cards(scope.session, task),
        may_decide=rules.may_decide(principal, res, task),
        **repo_context(res, principal, svc.base_url),
        **{"errors": NO_ERRORS, "typed": BodyForm(), "decision": DecisionForm(), "tool_run_typed": {}, **refused},
    )


async def refused_action(
    request: Request[Any, Any, Any], scope: TaskScope, exc: ForgeError, errors: FormErrors, **typed: Any
) -> Template:
    """The task page again after a refused action, read afresh (the action may have released the
    request's read session, and the task may have moved on): what was typed (`typed`, `decision`)
    kept, the refusal at the field it concerns."""
    async with scope.system.db.session() as s:
        res, svc, task = await scope.reload(s)
        fresh = dataclasses.replace(scope, session=s, res=res, svc=svc, task=task)
        return await task_view(request, fresh, None, exc.status, errors=errors, refused=exc, **typed)


class TaskPages(Controller):
    path = REPO_TASKS
    include_in_schema = False
    dependencies = PAGE_DEPENDENCIES

    @get("/")
    async def list_tasks(
        self,
        request: Request[Any, Any, Any],
        repo_scope: RepoScopeDep,
        task_state: Annotated[str | None, QueryParameter(name="state")] = None,
        on_pull_request: Annotated[int | None, QueryParameter(ge=1, le=1_000_000_000)] = None,
    ) -> Template:
        # "Ask an agent" on a pull request: the start form, tied to it.
        return await list_page(request, repo_scope, task_state=task_state, on_pull_request=on_pull_request)

    @post("/")
    async def start(
        self, request: Request[Any, Any, Any], repo_scope: RepoScopeDep, data: URLEncodedBody[StartForm]
    ) -> Template | Redirect:
        async def again(exc: ForgeError) -> Template:
            errors = form_errors(exc, StartForm.__struct_fields__, START_ALIASES)
            return await list_page(request, repo_scope, form=data, errors=errors, status_code=exc.status)

        async def create() -> TaskRead:
            return await start_task(repo_scope, task_create(data))  # a refused form shows again, kept

        read = await or_form_error(create(), again)
        if isinstance(read, Template):
            return read
        return Redirect(f"/{read.repository}/tasks/{read.number}", status_code=303)

    @get("/{number:str}")
    async def task_page(
        self,
        request: Request[Any, Any, Any],
        task_scope: TaskScopeDep,
        run: Annotated[str | None, QueryParameter(name="run")] = None,
    ) -> Template:
        return await task_view(request, task_scope, run_number(run))

    @get("/{number:str}/timeline")
    async def timeline_items(
        self,
        request: Request[Any, Any, Any],
        task_scope: TaskScopeDep,
        after: Annotated[int, QueryParameter(ge=0)] = 0,
        run: Annotated[str | None, QueryParameter(name="run")] = None,
    ) -> Template:
        """The transcript's items after event `after`, rendered (what the live page appends).
        `X-Last-Seq` is the last event read (of every run); `X-More: yes` when there are more."""
        events = await transcript.read(task_scope.session, task_scope.task.id, after=after, limit=FRAGMENT_EVENTS)
        shown = of_run(events, run_number(run))
        reply = page(request, "tasks/_timeline_items.html", items=await timeline_of(task_scope, shown))
        reply.headers["X-Last-Seq"] = str(events[-1].seq if events else after)
        reply.headers["X-More"] = "yes" if len(events) >= FRAGMENT_EVENTS else "no"
        reply.headers["Cache-Control"] = "no-store"
        return reply

    @post("/{number:str}/{action:str}")
    async def act(
        self,
        request: Request[Any, Any, Any],
        task_scope: TaskScopeDep,
        action: FromPath[str],
        data: URLEncodedBody[BodyForm],
    ) -> Template | Redirect:
        act = PAGE_ACTIONS.get(action)
        if act is None:
            raise NotFound("no such action")

        async def run() -> TaskRead:
            # `stop` here only asks: the page shows "stopping" until the worker settles.
            return await act_on_task(task_scope, act, message_create(data))

        async def again(exc: ForgeError) -> Template:
            errors = form_errors(exc, ("body",), BODY_ALIASES)
            return await refused_action(request, task_scope, exc, errors, typed=data)

        read = await or_form_error(run(), again)
        if isinstance(read, Template):
            return read
        return Redirect(f"/{read.repository}/tasks/{task_scope.number}", status_code=303)

    @post("/{number:str}/approvals/{approval_id:str}")
    async def decide(
        self,
        request: Request[Any, Any, Any],
        task_scope: TaskScopeDep,
        approval_id: FromPath[str],
        data: URLEncodedBody[DecisionForm],
    ) -> Template | Redirect:
        async def run() -> ApprovalRead:
            return await decide_approval(task_scope, approval_id, approval_decide(data))

        async def again(exc: ForgeError) -> Template:
            errors = form_errors(exc, ("approval-reason",), DECISION_ALIASES)
            return await refused_action(request, task_scope, exc, errors, decision=data)

        decided = await or_form_error(run(), again)
        if isinstance(decided, Template):
            return decided
        return Redirect(f"/{task_scope.owner}/{task_scope.name}/tasks/{task_scope.number}", status_code=303)

    @post("/{number:str}/tool-runs/{run_id:int}")
    async def decide_tool_run(
        self,
        request: Request[Any, Any, Any],
        task_scope: TaskScopeDep,
        run_id: FromPath[int],
        data: URLEncodedBody[DecisionForm],
    ) -> Template | Redirect:
        """A custom tool call's card: Approve (it runs exactly the inputs shown, once) or Deny."""

        async def again(exc: ForgeError) -> Template:
            reason = tool_approvals.reason_input(run_id)
            errors = form_errors(exc, (reason,), {"reason": reason})
            return await refused_action(request, task_scope, exc, errors, tool_run_typed={run_id: data.reason})

        refused = await or_form_error(tool_approvals.decide(task_scope, run_id, data), again)
        if isinstance(refused, Template):
            return refused
        return Redirect(f"/{task_scope.owner}/{task_scope.name}/tasks/{task_scope.number}", status_code=303)


class MyTaskPages(Controller):
    include_in_schema = False
    dependencies = PAGE_DEPENDENCIES
    guards = [signed_in]  # a person's own lists

    @get("/tasks")
    async def mine(
        self, request: Request[Any, Any, Any], db_session: DbSession, actor: ActorDep, task_system: SystemDep
    ) -> Template:
        svc = task_system.service(db_session)
        return page(request, "tasks/mine.html", tasks=await svc.to_reads(await svc.list_for_user(actor.principal)))

    @get("/tasks/awaiting-review")
    async def awaiting_review(
        self, request: Request[Any, Any, Any], db_session: DbSession, actor: ActorDep, task_system: SystemDep
    ) -> Template:
        """Tasks awaiting the signed-in person's review: a page, or (for the dashboard, htmx) its list."""
        svc = task_system.service(db_session)
        tasks = await svc.to_reads(await inbox.awaiting_review(db_session, actor.principal))
        fragment = request.headers.get("hx-request") == "true"
        return page(request, "tasks/awaiting.html", tasks=tasks, fragment=fragment)
