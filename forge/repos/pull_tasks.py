"""Pull requests of tasks: a task's branch (`agent/<number>-<slug>`, written by forgehand only)
proposed into its base, opened by the task's agent (tasks/core/task_pulls.py keeps it following
the task). A review or a merge of such a pull request over the API goes through the task
(`TaskWork`, which the composition root hands in): the task's merge rules, its `pre_merge`
question and its follow-up run on a change request apply, exactly as on the task's review page.
What only a person's branch has (Update branch, suggestions) answers `task_pull_request`."""

import re
from typing import Protocol, runtime_checkable

import msgspec
from sqlalchemy import select

from forge.core.error_codes import Code
from forge.core.errors import InvalidState
from forge.db import audit
from forge.db.audit import Actor
from forge.db.models import PullRequest
from forge.git.compare import divergence
from forge.git.merge import MergeStrategy
from forge.repos.numbers import allocate_number
from forge.repos.pull_shapes import PullReviewCreate, PullReviewRead
from forge.repos.pulls import Pulls
from forge.repos.repositories import RepoResource

_TASK_BRANCH = re.compile(r"agent/(\d{1,9})-", re.IGNORECASE)


class TaskPullStatus(msgspec.Struct, frozen=True, kw_only=True):
    """What the task's merge rules say of its pull request now."""

    approvals: list[str]  # whose approvals of the head count
    required_approvals: int
    blockers: list[str]  # every rule that does not hold, in words (empty: it may merge)


@runtime_checkable  # a handler's dependency: Litestar checks its type
class TaskWork(Protocol):
    """What the tasks package does for a task's pull request. Each call opens its own transactions:
    the caller holds none."""

    async def merge(
        self, actor: Actor, owner: str, name: str, task: int, strategy: MergeStrategy, head_sha: str
    ) -> None: ...

    async def review(self, actor: Actor, owner: str, name: str, task: int, data: PullReviewCreate) -> int:
        """Submit the review on the task; the id of the task review it became."""
        ...

    async def reviews(self, actor: Actor, owner: str, name: str, task: int) -> list[PullReviewRead]:
        """The task's reviews, in the pull request's shape."""
        ...

    async def status(self, actor: Actor, owner: str, name: str, task: int) -> TaskPullStatus:
        """Whether the task's merge rules hold now, and why not."""
        ...


def task_number_of(head_ref: str) -> int | None:
    """The task whose branch a pull request's head is (`agent/<number>-<slug>`), or None."""
    found = _TASK_BRANCH.match(head_ref)
    return int(found.group(1)) if found else None


def refuse_task_pull(res: RepoResource, pull: PullRequest, base_url: str) -> None:
    """A task's pull request is reviewed and merged through its task (for now): 409 naming where."""
    number = task_number_of(pull.head_ref)
    if number is not None:
        raise InvalidState(
            f"#{pull.number} holds the work of task #{number}: review and merge it on the task's review page, "
            f"{base_url}/{res.full_name}/tasks/{number}/review",
            code=Code.TASK_PULL_REQUEST,
        )


async def open_for_task(
    pulls: Pulls, agent: Actor, res: RepoResource, *, head: str, base: str, title: str, body: str
) -> PullRequest | None:
    """The pull request of a task's branch into its base, opened by the task's agent (or the open
    one, when there is one already). None when a branch is gone or the head adds nothing."""
    found = (
        await pulls.session.execute(
            select(PullRequest).where(
                PullRequest.repo_id == res.repo.id,
                PullRequest.head_ref == head,
                PullRequest.base_ref == base,
                PullRequest.state == "open",
            )
        )
    ).scalar_one_or_none()
    if found is not None:
        return found
    tips = await pulls.store.read(res.key, divergence, base, head)
    if tips.base_sha is None or tips.head_sha is None or tips.ahead_by == 0:
        return None
    pull = PullRequest(
        repo_id=res.repo.id,
        number=await allocate_number(pulls.session, res.repo.id),
        title=title[:256] or head,
        body=body[:65_536],
        head_ref=head,
        base_ref=base,
        head_sha=tips.head_sha,
        base_sha=tips.base_sha,
        state="open",
        author_id=agent.principal.account_id,
    )
    pulls.session.add(pull)
    await pulls.session.flush()
    audit.record(pulls.session, agent, "repo.pull.open", f"{res.full_name}#{pull.number}", head=head, base=base)
    await pulls.publish(agent, res, pull, "opened")
    return pull
