"""The `forgehand/task` commit status: a run that commits reports how it ended on its commit, as a
CI system reports a build (docs/tasks.md, "Commit status"), so the commit page, the combined
status and `status.created` webhooks show an agent's work like any other check."""

from forge.core.errors import InvalidInput
from forge.db.models import Repository
from forge.repos import statuses
from forge.repos.statuses import StatusState
from tasks.core.lifecycle import Lifecycle
from tasks.core.models import Run, Task
from tasks.core.states import RunState

CONTEXT = "forgehand/task"
# run state -> (status state, description); "{seq}" and "{reason}" are filled in.
_REPORTS: dict[RunState, tuple[StatusState, str]] = {
    RunState.SUCCEEDED: ("success", "run {seq} succeeded"),
    RunState.FAILED: ("failure", "run {seq} failed: {reason}"),
    RunState.STOPPED: ("error", "run {seq} was stopped"),
    RunState.BLOCKED: ("pending", "run {seq} waits for a person"),
}


async def report(life: Lifecycle, task: Task, repo: Repository, run: Run) -> None:
    """Record the run's ending on the commit it made (nothing when it made none), in the run's
    settle transaction, and publish it."""
    found = _REPORTS.get(RunState(run.state))
    if found is None or not run.end_sha or run.no_changes:
        return
    state, text = found
    full = f"{repo.owner.login}/{repo.name}"
    try:
        row, combined = await statuses.record(
            life.session,
            repo.id,
            run.end_sha,
            state=state,
            context=CONTEXT,
            description=text.format(seq=run.seq, reason=run.failure_reason or "error"),
            target_url=f"{life.base_url}/{full}/tasks/{task.number}",
            creator_id=task.agent_id,
        )
    except InvalidInput:  # the commit holds its thousand statuses of this context already
        return
    await life.publish("status.created", task, repo, run=run, data=statuses.created_payload(row, combined))
