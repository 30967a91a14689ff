"""A task's own pull request: once a task has changes for review, its branch (`agent/<n>-...`) is
proposed into its base as a pull request, opened by the task's agent on behalf of the person who
started it, so people see agents' work among everyone's pull requests (the Pull requests tab, the
dashboard, `pull_request.*` webhooks) and the task JSON names it (`pull_request`).

The pull request follows the task: later runs move its head (`pull_request.synchronized`), the
task's merge records it merged, closing the task closes it, and each review of the task is also
the pull request's (`pull_request.review_submitted`, beside the task's `review.submitted`). The
pull request's page and API review and merge it through the task (forge's `TaskWork`)."""

from forge.core.access import Principal
from forge.db.audit import Actor
from forge.db.models import Account, PullRequest
from forge.git import RefUpdate, RepoStore
from forge.repos.pull_tasks import open_for_task
from forge.repos.pulls import Pulls
from forge.repos.repositories import RepoResource
from forge.repos.text_refs import defuse_closing
from tasks.core.lifecycle import Lifecycle
from tasks.core.models import Task


async def _agent(life: Lifecycle, task: Task) -> Actor:
    bot = await life.session.get(Account, task.agent_id)
    login = bot.login if bot is not None else "agent"
    return Actor(principal=Principal(account_id=task.agent_id, login=login, type="Bot", via="internal"))


def _body(task: Task, starter: str, url: str) -> str:
    # The agent's words close no issue when this merges: only the trigger's `Fixes #N` below does.
    summary = f"{defuse_closing(task.summary.strip())}\n\n" if task.summary.strip() else ""
    trigger = task.trigger if isinstance(task.trigger, dict) else {}
    issue = trigger.get("issue") if trigger.get("kind") == "issue" else None
    # A task started by assigning an issue fixes it: the issue closes when this merges.
    fixes = f"\n\nFixes #{issue['number']}" if isinstance(issue, dict) and "number" in issue else ""
    # A task asked to work on a pull request proposes its result into that one's head (stacked).
    stacked = f" It goes into `{task.base}`, the head branch of #{task.pull_number}." if task.pull_number else ""
    return f"{summary}The work of [task #{task.number}]({url}), started by @{starter}.{stacked}{fixes}\n"


async def _own(pulls: Pulls, res: RepoResource, task: Task) -> PullRequest | None:
    if task.result_pull_number is None:
        return None
    return await pulls.get(res, task.result_pull_number)


async def follow(life: Lifecycle, store: RepoStore, task: Task, res: RepoResource) -> None:
    """After a run settled: open the task's pull request when it is in review with changes, or move
    the open one to the task's head."""
    if not task.head_sha or task.head_sha == task.base_sha or task.head_is_wip:
        return
    pulls = Pulls(life.session, store, life.bus, life.base_url)
    agent = await _agent(life, task)
    pull = await _own(pulls, res, task)
    if pull is not None and pull.state == "open":
        if pull.head_sha != task.head_sha:
            await pulls.after_push(agent, res, [RefUpdate(pull.head_sha, task.head_sha, f"refs/heads/{task.branch}")])
        return
    if task.state != "awaiting_review":
        return
    starter = await life.session.get(Account, task.started_by_id) if task.started_by_id else None
    url = f"{life.base_url}/{res.full_name}/tasks/{task.number}"
    opened = await open_for_task(
        pulls,
        agent,
        res,
        head=task.branch,
        base=task.base,
        title=task.title,
        body=_body(task, starter.login if starter else "forgehand", url),
    )
    if opened is not None:
        task.result_pull_number = opened.number


async def merged(pulls: Pulls, actor: Actor, res: RepoResource, task: Task, how: str, sha: str, before: str) -> None:
    """The task was merged: its open pull request is recorded merged too."""
    pull = await _own(pulls, res, task)
    if pull is not None and pull.state == "open":
        pull.head_sha = task.head_sha
        await pulls.record_merged(actor, res, pull, how, sha, before)


async def closed(pulls: Pulls, actor: Actor, res: RepoResource, task: Task) -> None:
    """The task was closed: its open pull request is closed too."""
    pull = await _own(pulls, res, task)
    if pull is not None:
        await pulls.close_quietly(actor, res, pull)


async def reviewed(
    pulls: Pulls, actor: Actor, res: RepoResource, task: Task, review_id: int, verdict: str, comments: int
) -> None:
    """A review of the task was published: its open pull request says so too, so consumers of pull
    request events see agents' work reviewed as everyone's."""
    pull = await _own(pulls, res, task)
    if pull is not None and pull.state == "open":
        await pulls.record_review(actor, res, pull, review_id, verdict, comments)
