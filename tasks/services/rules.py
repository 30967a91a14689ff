"""Who may do what to a task: the one place that answers "may this principal start, act on
(message, answer, retry, close), stop, decide an approval of, review or merge this task", on top
of `forge.core.access` (the role and the token's scopes). Services call `require_*` (it raises the
error the API shows); pages call `may_*` to show or hide a form. Tested as a matrix.

Beyond the role:
- the task's own agent never decides its own parked calls, reviews or merges its own work
  (`ask` means ask a person; a review is someone else's);
- stopping is for the person who started the task, its agent, or a repository admin;
- only an account (not an anonymous principal) starts a task: runs are requested by someone;
- file contents shown through a task (its diff, the line a review comment quotes) are the
  repository's: they need `repo:read` on top of `tasks:read` (`may_read_contents`)."""

from forge.core.access import Action, Principal, Role, can, effective_role, require
from forge.core.errors import Forbidden
from forge.repos.repositories import RepoResource
from tasks.core.models import Task


def is_agent(principal: Principal, task: Task) -> bool:
    return principal.account_id is not None and principal.account_id == task.agent_id


def may_read(principal: Principal, res: RepoResource) -> bool:
    return can(principal, Action.TASK_READ, res)


def require_read(principal: Principal, res: RepoResource) -> None:
    require(principal, Action.TASK_READ, res)


def may_read_contents(principal: Principal, res: RepoResource) -> bool:
    """A task's diff and the lines its review comments quote: what `repo:read` reads. A token with
    `tasks:read` alone sees the task, its transcript and the diff's absence, never the files."""
    return can(principal, Action.TASK_READ, res) and can(principal, Action.REPO_READ, res)


def require_read_contents(principal: Principal, res: RepoResource) -> None:
    require(principal, Action.TASK_READ, res)
    require(principal, Action.REPO_READ, res)


def may_start(principal: Principal, res: RepoResource) -> bool:
    return principal.account_id is not None and can(principal, Action.TASK_WRITE, res)


def require_start(principal: Principal, res: RepoResource) -> None:
    require(principal, Action.TASK_WRITE, res)
    if principal.account_id is None:
        raise Forbidden("sign in or send a token")


def may_act(principal: Principal, res: RepoResource) -> bool:
    """Message, answer, retry, close."""
    return can(principal, Action.TASK_WRITE, res)


def require_act(principal: Principal, res: RepoResource) -> None:
    require(principal, Action.TASK_WRITE, res)


def may_stop(principal: Principal, res: RepoResource, task: Task) -> bool:
    if principal.via == "internal":
        return True
    if principal.account_id is not None and principal.account_id in (task.started_by_id, task.agent_id):
        return True
    role = effective_role(principal, res)
    return role is not None and role >= Role.ADMIN


def require_stop(principal: Principal, res: RepoResource, task: Task) -> None:
    require(principal, Action.TASK_WRITE, res)
    if not may_stop(principal, res, task):
        raise Forbidden("only the starter, the task's agent or a repository admin can stop a task")


def may_decide(principal: Principal, res: RepoResource, task: Task) -> bool:
    return can(principal, Action.TASK_WRITE, res) and not is_agent(principal, task)


def require_decide(principal: Principal, res: RepoResource, task: Task) -> None:
    require(principal, Action.TASK_WRITE, res)
    if is_agent(principal, task):
        raise Forbidden("the task's agent cannot decide its own tool calls", code="agent_cannot_decide")


def may_review(principal: Principal, res: RepoResource, task: Task | None = None) -> bool:
    """Without a task: whether the principal reviews this repository's tasks at all (its
    verdicts count; a reviewer who lost access neither counts nor blocks)."""
    return can(principal, Action.REVIEW_WRITE, res) and (task is None or not is_agent(principal, task))


def require_review(principal: Principal, res: RepoResource, task: Task) -> None:
    require(principal, Action.REVIEW_WRITE, res)
    if is_agent(principal, task):
        raise Forbidden("the task's agent cannot review its own work", code="agent_cannot_review")


def approval_counts(account_id: int, task: Task, *, not_by_starter: bool) -> bool:
    """An approval of the current head counts unless it is the agent's own or, when the merge
    rules say so, the starter's."""
    return account_id != task.agent_id and not (not_by_starter and account_id == task.started_by_id)


def may_merge(principal: Principal, res: RepoResource, task: Task) -> bool:
    return can(principal, Action.REVIEW_WRITE, res) and not is_agent(principal, task)


def require_merge(principal: Principal, res: RepoResource, task: Task) -> None:
    require(principal, Action.REVIEW_WRITE, res)
    if is_agent(principal, task):
        raise Forbidden("the task's agent cannot merge its own work", code="agent_cannot_merge")


def may_work_as_agent(principal: Principal, res: RepoResource) -> bool:
    """A bot works on a repository's tasks with write access (it pushes the task branch)."""
    role = effective_role(principal, res)
    return role is not None and role >= Role.WRITE


def may_configure(principal: Principal, res: RepoResource) -> bool:
    """The repository's task settings (model endpoint, limits, merge rules)."""
    return can(principal, Action.REPO_ADMIN, res)


def require_configure(principal: Principal, res: RepoResource) -> None:
    require(principal, Action.REPO_ADMIN, res)
