"""Pull requests of tasks: a task's branch (`agent/<number>-<slug>`, written by forgehand only)
proposed into its base, opened by the task's agent (tasks/core/task_pulls.py keeps it following
the task). Its page and its API review and merge it through the task (`TaskWork`, which the
composition root hands in): the task's reviews, inline comments and pending reviews are shown and
written there, and the task's merge rules, its `pre_merge` question and its follow-up run on a
change request apply, as on the task's review page (which now answers with a redirect here).
What only a person's branch has (Update branch, suggestions, editing) answers `task_pull_request`."""

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
from forge.repos.pull_shapes import PullCommentRead, PullReviewCreate, PullReviewRead
from forge.repos.pulls import Pulls
from forge.repos.repositories import RepoResource
from forge.repos.text_refs import task_number_of as task_number_of


class TaskPullStatus(msgspec.Struct, frozen=True, kw_only=True):
    """What the task's merge rules say of its pull request now."""

    approvals: list[str]  # whose approvals of the head count
    required_approvals: int
    blockers: list[str]  # every rule that does not hold, in words (empty: it may merge)
    merge_strategy: str | None = None  # once merged: how (merge, squash, fast-forward, already_merged)


class TaskLineComment(msgspec.Struct, frozen=True, kw_only=True):
    """An inline comment of the task's reviews, in the pull request's shape."""

    comment: PullCommentRead
    quoted: str  # the line as it read when the comment was written ("" when the reader may not see contents)
    pending: bool  # in the reader's own pending review


class TaskPullSide(msgspec.Struct, frozen=True, kw_only=True):
    """What a task's pull request page shows of its task, for one reader."""

    reviews: list[PullReviewRead]  # published, oldest first, and the reader's pending one (`PENDING`)
    comments: list[TaskLineComment]  # of those reviews, oldest first
    runs: dict[int, int]  # review id -> the follow-up run its change request started
    status: TaskPullStatus


@runtime_checkable  # a handler's dependency: Litestar checks its type
class TaskWork(Protocol):
    """What the tasks package does for a task's pull request. Each call opens its own transactions:
    the caller holds none."""

    async def merge(
        self, actor: Actor, owner: str, name: str, task: int, strategy: MergeStrategy, head_sha: str
    ) -> None: ...

    async def review(self, actor: Actor, owner: str, name: str, task: int, data: PullReviewCreate) -> int:
        """Submit the review on the task (with the reader's pending comments); without an event, add
        its comments to the reader's pending review. The id of the task review it became."""
        ...

    async def discard(self, actor: Actor, owner: str, name: str, task: int, review_id: int) -> None:
        """Throw the reader's pending review `review_id` away, with its comments."""
        ...

    async def reviews(self, actor: Actor, owner: str, name: str, task: int) -> list[PullReviewRead]:
        """The task's reviews, in the pull request's shape (the reader's pending one included)."""
        ...

    async def side(self, actor: Actor, owner: str, name: str, task: int) -> TaskPullSide:
        """The task's reviews, inline comments and merge rules, as its pull request's page shows them."""
        ...

    async def status(self, actor: Actor, owner: str, name: str, task: int) -> TaskPullStatus:
        """Whether the task's merge rules hold now, and why not."""
        ...


def refuse_task_pull(res: RepoResource, pull: PullRequest, base_url: str) -> None:
    """A task's branch is written by its agent only: what would change it otherwise is a 409 that
    says how to get the change made (a change request in a review of the pull request)."""
    number = task_number_of(pull.head_ref)
    if number is not None:
        raise InvalidState(
            f"#{pull.number} holds the work of task #{number}, whose agent writes its branch: review it and "
            f"request changes, {base_url}/{res.full_name}/pull/{pull.number}/files",
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
    await pulls.announce_opened(agent, res, pull)
    return pull
