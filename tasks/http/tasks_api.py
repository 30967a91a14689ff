"""REST for tasks. Thin: the path dependency loads the repository and the task, the handler calls
one action (tasks/http/actions.py) or read, and returns a schema."""

from typing import Annotated

import msgspec
from litestar import Controller, get, post
from litestar.params import FromPath, JSONBody, QueryParameter

from forge.core.access import Action
from forge.core.errors import Unauthenticated
from forge.http.deps import ActorDep, DbSession
from tasks.core import transcript
from tasks.core.schemas import MessageCreate, SkippedPage, TaskCreate, TaskRead, TranscriptPage
from tasks.http.actions import act_on_task, check_task, start_task, stop_and_wait
from tasks.http.deps import DEPENDENCIES, TASK, TASKS, RepoScopeDep, SystemDep, TaskScopeDep
from tasks.services.reads import skipped_page
from tasks.services.subtasks import subtask_reads


class TaskController(Controller):
    tags = ["tasks"]
    dependencies = DEPENDENCIES

    @post(
        TASKS,
        summary="Start a task: an agent works on a goal in a sandbox",
        status_code=201,
        opt={"repo_action": Action.TASK_WRITE},
    )
    async def start(self, repo_scope: RepoScopeDep, data: JSONBody[TaskCreate]) -> TaskRead:
        return await start_task(repo_scope, data)

    @get(TASKS, summary="Tasks of a repository, newest first, a page at a time (page, per_page)")
    async def list_tasks(
        self,
        repo_scope: RepoScopeDep,
        task_state: Annotated[str | None, QueryParameter(name="state")] = None,
        page: Annotated[int, QueryParameter(ge=1, le=100_000)] = 1,
        per_page: Annotated[int, QueryParameter(ge=1, le=100)] = 100,
    ) -> list[TaskRead]:
        svc, res = repo_scope.svc, repo_scope.res
        listed = await svc.list_tasks(res, state=task_state, limit=per_page, offset=(page - 1) * per_page)
        return await svc.to_reads([(t, res) for t in listed])

    @get(TASK, summary="A task")
    async def get_task(self, task_scope: TaskScopeDep) -> TaskRead:
        return await task_scope.svc.to_read(task_scope.task, task_scope.res)

    @get(TASK + "/subtasks", summary="The subtasks the task's agent spawned (oldest first)")
    async def subtasks(self, task_scope: TaskScopeDep) -> list[TaskRead]:
        return await subtask_reads(task_scope.svc, task_scope.res, task_scope.task)

    @post(TASK + "/messages", summary="Send the agent a message (queued while a run is active)", status_code=200)
    async def message(self, task_scope: TaskScopeDep, data: JSONBody[MessageCreate]) -> TaskRead:
        return await act_on_task(task_scope, "message", data)

    @post(TASK + "/answer", summary="Answer the agent's pending question", status_code=200)
    async def answer(self, task_scope: TaskScopeDep, data: JSONBody[MessageCreate]) -> TaskRead:
        return await act_on_task(task_scope, "answer", data)

    @post(TASK + "/retry", summary="Retry a failed or stopped task", status_code=200)
    async def retry(self, task_scope: TaskScopeDep) -> TaskRead:
        return await act_on_task(task_scope, "retry", None)

    @post(TASK + "/close", summary="Close a task", status_code=200)
    async def close(self, task_scope: TaskScopeDep) -> TaskRead:
        return await act_on_task(task_scope, "close", None)

    @post(
        TASK + "/stop",
        summary="Stop a task: kills its sandbox; answers when the container is gone (idempotent)",
        status_code=200,
    )
    async def stop(self, task_scope: TaskScopeDep) -> TaskRead:
        return await stop_and_wait(task_scope)

    @get(TASK + "/transcript", summary="The transcript, paginated by sequence number")
    async def transcript_page(
        self,
        task_scope: TaskScopeDep,
        after: Annotated[int, QueryParameter(name="after", ge=0, le=2**31 - 1)] = 0,
        limit: Annotated[int, QueryParameter(name="limit", ge=1, le=1000)] = 200,
    ) -> TranscriptPage:
        task = task_scope.task
        events = await transcript.read(task_scope.session, task.id, after=after, limit=limit)
        next_after = events[-1].seq if events else after
        return TranscriptPage(events=events, next_after=next_after, complete=next_after >= task.last_seq)

    @get(TASK + "/runs/{run:str}/skipped", summary="The paths a run's snapshot refused, paginated")
    async def skipped(
        self,
        task_scope: TaskScopeDep,
        run: FromPath[str],
        cursor: Annotated[str, QueryParameter(name="cursor", max_length=16)] = "",
        limit: Annotated[int, QueryParameter(name="limit", ge=1, le=1000)] = 100,
    ) -> SkippedPage:
        return await skipped_page(task_scope.session, task_scope.task, run, cursor, limit)


class UserTaskController(Controller):
    tags = ["tasks"]
    dependencies = DEPENDENCIES

    @get("/api/v1/user/tasks", summary="My tasks: started by me or worked on by me, across repositories")
    async def my_tasks(self, db_session: DbSession, actor: ActorDep, task_system: SystemDep) -> list[TaskRead]:
        if actor.principal.account_id is None:
            raise Unauthenticated("sign in or send a token")
        svc = task_system.service(db_session)
        return await svc.to_reads(await svc.list_for_user(actor.principal))


__all__ = ["TaskController", "UserTaskController"]


class EnvironmentCheck(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A smoke command run in the repository's environment, with no agent."""

    command: Annotated[str, msgspec.Meta(min_length=1, max_length=10_000)]
    agent: Annotated[str, msgspec.Meta(max_length=40)] = ""  # the bot the task runs as ("": the first)


class EnvironmentCheckController(Controller):
    tags = ["tasks"]
    dependencies = DEPENDENCIES

    @post(
        "/api/v1/repos/{owner:str}/{name:str}/environment/check",
        summary="Build the environment (if needed) and run a smoke command in it, no agent: a command task",
        status_code=201,
        opt={"repo_action": Action.REPO_ADMIN},
    )
    async def check(self, repo_scope: RepoScopeDep, data: JSONBody[EnvironmentCheck]) -> TaskRead:
        return await start_task(repo_scope, await check_task(repo_scope, data))
