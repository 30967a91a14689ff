"""What a task waits for, and for whom, in one line for the task page's header ("waiting for your
review", "waiting for an answer from ana", ...). Who may do it is `tasks.services.rules`'s answer."""

from forge.core.access import Principal
from forge.repos.repositories import RepoResource
from tasks.core.models import Task
from tasks.core.schemas import TaskRead
from tasks.services import rules

# What an active task waits for (the live page says it again when the state changes, with the
# badge: the two never disagree).
ACTIVE_LINES = {
    "queued": "Waiting for a worker.",
    "running": "The agent is working; messages sent now are delivered as its next run.",
}


def waiting_line(read: TaskRead, task: Task, principal: Principal, res: RepoResource) -> str:
    me = principal.login if principal.account_id is not None else None
    starter = read.started_by
    state = read.state
    if state == "queued":
        where = f" (#{read.queue_position} in the queue)" if read.queue_position else ""
        labels = f" with labels {', '.join(read.waiting_for_labels)}" if read.waiting_for_labels else ""
        return f"Waiting for a worker{labels}{where}."
    if state == "running":
        return ACTIVE_LINES["running"]
    if state == "blocked" and read.pending_approval is not None:
        if read.pending_approval.state != "pending":
            return f"The approval is {read.pending_approval.state}: retry or close the task."
        if rules.may_decide(principal, res, task):
            return "Waiting for your approval (or another collaborator's with write access) of a tool call."
        return "Waiting for approval of a tool call by someone with write access."
    if state == "blocked":
        if me is not None and me == starter:
            return "Waiting for your answer to the agent's question."
        asked = f"from {starter}" if starter else "from the person who started it"
        return f"Waiting for an answer {asked} (or anyone with write access)."
    if state == "awaiting_review":
        if read.no_changes:
            return "No changes: the agent's runs changed nothing. Message the agent to try again, or close the task."
        if rules.may_review(principal, res, task):
            return "Waiting for your review (or another reviewer's with write access)."
        return "Waiting for review by someone with write access."
    if state == "failed":
        return "Failed: retry it (a new run from the task branch) or close it."
    if state == "stopped":
        return "Stopped: retry it or close it."
    if state == "merged":
        return f"Merged into {read.base}."
    return "Closed."
