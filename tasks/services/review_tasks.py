"""Review tasks: a bot asked to review a pull request (forge's `review_request` ask,
forge/repos/pull_review_agents.py) works on the pull request's head as the person who asked.

The task starts from the head branch (its `base`), so its workspace is the code under review;
its goal (composed by forge) says to review and not to change code. Its trigger is
`review_request` with the pull request's number, and the task links the pull request
(`on_pull_request`). Its result is a review posted by its bot through the run's `submit_review`
tool (tasks/run/backchannel/review.py). A review task never proposes code: its run takes no
snapshot commit (tasks/run/settle.py), so it never opens a pull request of its own nor merges; a
run that ends without a review fails `agent_no_result` (tasks/run/execution.py)."""

from forge.core.error_codes import Code
from forge.core.errors import InvalidState, NotFound
from forge.db.audit import Actor
from forge.repos.issue_agents import AgentAnswer, AgentAsk
from forge.repos.pulls import Pulls
from forge.repos.repositories import RepoResource
from tasks.core.schemas import GOAL_MAX, TaskCreate, Trigger
from tasks.services import repo_settings
from tasks.services.tasks import TaskService


async def start(svc: TaskService, actor: Actor, res: RepoResource, ask: AgentAsk) -> AgentAnswer:
    """Start the review task (in the caller's savepoint): the start rule, the requester's key, the policy."""
    number = ask.pull_request
    if number is None:
        raise NotFound("a review request names its pull request", code=Code.PULL_NOT_FOUND)
    pull = await Pulls(svc.session, svc.store, svc.bus, svc.base_url).get(res, number)
    if pull.state != "open" or not pull.head_sha:
        raise InvalidState(f"#{number} is not open: an agent reviews open pull requests only", code=Code.PULL_NOT_OPEN)
    runtime = await repo_settings.trigger_runtime(svc.session, res)
    data = TaskCreate(
        goal=ask.goal[:GOAL_MAX], agent=ask.agent, title=ask.title[:200], base=pull.head_ref, on_pull_request=number,
        runtime=runtime,
    )  # fmt: skip
    task = await svc.start(actor, res, data, trigger=Trigger.for_review_request(number))
    task.pull_number = number
    return AgentAnswer(task_number=task.number)
