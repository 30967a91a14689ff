"""The tasks side of agents asked from issues and comments (forge's `AgentWork`,
forge/repos/issue_agents.py): start the task forge composed, as the person who assigned or
mentioned the bot, under the start rule (who may start a task for that bot here, with whose model
key), or continue the bot's own task when the comment is on its pull request; otherwise say why.

The start runs in the caller's transaction (the assignment and its task commit together, so two
parallel assignments of one bot start one task), inside a savepoint: a refused start (the start
rule, a missing model, the policy's `user_prompt_submit`) leaves the assignment standing and
its reason on the issue's timeline.

It also puts a triggered task's progress on its issue's timeline: its pull request, a question
its agent asks, its result (`on_event`, subscribed to the bus by `TaskSystem`)."""

from collections.abc import Callable

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from forge.core.error_codes import Code
from forge.core.errors import ForgeError, InvalidState
from forge.db.audit import Actor
from forge.db.events import Event, TaskStateChanged
from forge.db.issue_models import Issue, IssueEvent
from forge.db.models import Account
from forge.repos.issue_agents import AgentAnswer, AgentAsk
from forge.repos.pulls import Pulls
from forge.repos.repositories import RepoResource
from tasks.core.models import Task
from tasks.core.schemas import GOAL_MAX, MessageCreate, TaskCreate, Trigger
from tasks.services import pull_work, repo_settings, review_tasks
from tasks.services.tasks import TaskService

# The task states an issue's timeline tells about (at work, a question or approval, a result, the end).
TOLD = {"running", "blocked", "awaiting_review", "failed", "merged", "closed"}


class AgentTriggers:
    def __init__(self, service: Callable[[AsyncSession], TaskService]) -> None:
        self.service = service

    async def ask(self, session: AsyncSession, actor: Actor, res: RepoResource, ask: AgentAsk) -> AgentAnswer:
        svc = self.service(session)
        try:
            async with session.begin_nested():
                if ask.continue_task is not None:
                    return await self._continue(svc, actor, res, ask)
                if ask.kind == "review_request":  # a bot asked to review a pull request
                    return await review_tasks.start(svc, actor, res, ask)
                data = TaskCreate(
                    goal=ask.goal[:GOAL_MAX], agent=ask.agent, title=ask.title[:200], on_pull_request=ask.pull_request,
                    runtime=await repo_settings.trigger_runtime(session, res),
                )  # fmt: skip
                pulls = Pulls(session, svc.store, svc.bus, svc.base_url)
                # On a pull request: from its head, the pull request quoted, and linked both ways.
                data = await pull_work.for_pull_request(pulls, res, data)
                task = await svc.start(actor, res, data, trigger=_trigger(ask))
                await pull_work.link(pulls, actor, res, task, data.on_pull_request)
                return AgentAnswer(task_number=task.number)
        except ForgeError as exc:
            return AgentAnswer(refused=exc.detail)

    async def _continue(self, svc: TaskService, actor: Actor, res: RepoResource, ask: AgentAsk) -> AgentAnswer:
        """A comment to the bot on its own task's pull request: the task's next message."""
        found = await svc.session.execute(
            select(Task).where(Task.repo_id == res.repo.id, Task.number == ask.continue_task)
        )
        task = found.scalar_one_or_none()
        agent = await svc.session.get(Account, task.agent_id) if task is not None else None
        if task is None or agent is None or agent.login_key != ask.agent.lower():
            who = f"@{agent.login}" if agent is not None else "another agent"
            raise InvalidState(
                f"this pull request holds the work of task #{ask.continue_task} by {who}: mention {who} to ask "
                "for changes, or request changes in a review",
                code=Code.TASK_PULL_REQUEST,
            )
        await svc.message(actor, res, task, MessageCreate(body=ask.goal[:GOAL_MAX]))
        return AgentAnswer(task_number=task.number)


def _trigger(ask: AgentAsk) -> Trigger:
    if ask.kind == "issue" and ask.issue is not None:
        return Trigger.for_issue(ask.issue)
    return Trigger.for_mention(ask.comment_id or 0, issue=ask.issue, pull_request=ask.pull_request)


def issue_of(task: Task) -> int | None:
    """The issue a triggered task works for (assigned, or mentioned on it), if any."""
    trigger = task.trigger or {}
    issue = trigger.get("issue") if isinstance(trigger, dict) else None
    number = issue.get("number") if isinstance(issue, dict) else None
    return number if isinstance(number, int) else None


async def on_event(session: AsyncSession, event: Event) -> None:
    """A triggered task's state told on its issue's timeline (its question with it)."""
    if not isinstance(event.data, TaskStateChanged) or event.task is None or event.data.to not in TOLD:
        return
    task = (await session.execute(select(Task).where(Task.uuid == event.task.id))).scalar_one_or_none()
    number = issue_of(task) if task is not None else None
    if task is None or number is None:
        return
    issue = (
        await session.execute(select(Issue).where(Issue.repo_id == task.repo_id, Issue.number == number))
    ).scalar_one_or_none()
    if issue is None:
        return
    details: dict[str, object] = {"number": task.number, "state": event.data.to}
    if event.data.to == "blocked" and task.question:
        details["question"] = str(task.question)[:2_000]
    if task.result_pull_number is not None:
        details["pull_request"] = task.result_pull_number
    session.add(IssueEvent(issue_id=issue.id, actor_id=task.agent_id, event="task_state", data=details))
