"""Domain events. Every state change publishes one, inside the transaction that makes the change.

`forge` only defines the envelope, the payloads and the bus; subscribers are wired by the
composition root (`forge/app/factory.py`): the webhooks package writes outbox rows for them (same
transaction, so a crash cannot lose one), the tasks package fans transcript events out to live
views.

Each event type has one payload struct, and the payloads form a msgspec tagged union
(`EventPayload`, tag field `type` = the event type). `Event.type` is the payload's tag, so the
two cannot disagree. On the wire a payload is the notification's `data` object: its fields in
declaration order, without the tag (`data_of`); fields that are `UNSET` are left out. The types
are the webhook contract (docs/webhooks.md, section 4), so the msgspec schema-evolution rules
hold: new fields get defaults; a field's type never changes."""

import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any, Literal, cast

import msgspec
from msgspec import UNSET, UnsetType
from sqlalchemy.ext.asyncio import AsyncSession

from forge.db.engine import utcnow
from forge.db.issue_payloads import (
    CommentCreated,
    CommentDeleted,
    CommentEdited,
    IssueAssigned,
    IssueClosed,
    IssueEdited,
    IssueLabeled,
    IssueOpened,
    IssueReopened,
    ScheduleTriggered,
)
from forge.db.payload_base import (
    AccountRef,
    ApprovalDecidedName,
    EventType,
    FailureReasonName,
    MergedHowName,
    ParentRef,
    Payload,
    ReviewVerdictName,
    RunKindName,
    RunRef,
    RunStateName,
    TaskRef,
    TaskStateName,
)

# Re-exported: every payload and its pieces are importable from here.
__all__ = [
    "AccountRef",
    "ApprovalDecidedName",
    "CommentCreated",
    "CommentDeleted",
    "CommentEdited",
    "EventType",
    "FailureReasonName",
    "IssueAssigned",
    "IssueClosed",
    "IssueEdited",
    "IssueLabeled",
    "IssueOpened",
    "IssueReopened",
    "MergedHowName",
    "ParentRef",
    "Payload",
    "ReviewVerdictName",
    "RunKindName",
    "RunRef",
    "RunStateName",
    "ScheduleTriggered",
    "TaskRef",
    "TaskStateName",
]


class TaskCreated(Payload, frozen=True, tag="task.created"):
    """No fields (yet): everything about the new task is in `meta.task`."""


class TaskStateChanged(Payload, frozen=True, tag="task.state_changed"):
    from_: TaskStateName | None = msgspec.field(name="from")  # None: the task was just created
    to: TaskStateName
    queue_position: int | UnsetType | None = UNSET  # only when `to` is queued (1-based)
    failure_reason: FailureReasonName | UnsetType = UNSET  # only when `to` is failed
    error: str | UnsetType = UNSET  # only with failure_reason


class RunStarted(Payload, frozen=True, tag="run.started"):
    kind: RunKindName


class RunFinished(Payload, frozen=True, tag="run.finished"):
    kind: RunKindName
    state: RunStateName
    exit_code: int | None
    failure_reason: FailureReasonName | None
    error: str
    end_sha: str


class _Approval(Payload, frozen=True):
    """The fields both approval events share, in their wire order."""

    approval_id: str  # uuid
    tool_use_id: str
    tool_name: str
    tool_input: dict[str, Any]
    input_hash: str
    reason: str
    held: bool
    requested_by: str  # the endpoint URL(s) that asked
    expires_at: str  # as Python's isoformat() writes it (the wire's historical spelling)


class ApprovalRequested(_Approval, frozen=True, tag="approval.requested"):
    state: Literal["pending"]


class ApprovalResolved(_Approval, frozen=True, tag="approval.resolved"):
    state: ApprovalDecidedName
    decision_reason: str | UnsetType = UNSET  # only when a person decided


class ReviewComment(msgspec.Struct, frozen=True, kw_only=True):
    path: str
    side: Literal["base", "head"]
    line: int
    body: str


class ReviewSubmitted(Payload, frozen=True, tag="review.submitted"):
    review_id: str  # uuid
    verdict: ReviewVerdictName
    body: str
    commit_sha: str
    comments: list[ReviewComment]


class TaskMerged(Payload, frozen=True, tag="task.merged"):
    strategy: MergedHowName
    base: str
    base_sha_before: str
    merged_sha: str
    head: str
    head_sha: str
    approvals: list[str]  # logins whose approvals counted
    branch_deleted: bool


class TaskProgress(Payload, frozen=True, tag="task.progress"):
    """The agent's progress note (the back-channel's `record_progress`), rate-limited per run."""

    message: str


class PushedRef(msgspec.Struct, frozen=True, kw_only=True):
    ref: str
    before: str  # zeros: created
    after: str  # zeros: deleted


class RepoPushed(Payload, frozen=True, tag="repo.pushed"):
    refs: list[PushedRef]


class StatusCreated(Payload, frozen=True, tag="status.created"):
    """A commit status was reported (`POST .../statuses/{sha}`); `state` is that status's, and
    `combined` the commit's combined state with it (docs/repositories.md, "Commit statuses")."""

    id: int
    sha: str
    state: Literal["pending", "success", "failure", "error"]
    context: str
    description: str
    target_url: str
    combined: Literal["pending", "success", "failure"]


class PullBranch(msgspec.Struct, frozen=True, kw_only=True):
    ref: str  # the branch name
    sha: str  # its tip as the pull request saw it ("" once the head branch is gone)


class PullRequestPayload(Payload, frozen=True):
    """What every `pull_request.*` notification says about the pull request (docs/pulls.md)."""

    number: int
    title: str
    html_url: str
    state: Literal["open", "closed", "merged"]
    draft: bool
    head: PullBranch
    base: PullBranch
    author: AccountRef | None


class PullRequestOpened(PullRequestPayload, frozen=True, tag="pull_request.opened"):
    pass


class PullRequestSynchronized(PullRequestPayload, frozen=True, tag="pull_request.synchronized"):
    """The head branch moved (a push, an Update branch); `before` is its previous tip."""

    before: str
    dismissed_reviews: int  # approvals and change requests the push made stale (branch rule)


class PullRequestReviewSubmitted(PullRequestPayload, frozen=True, tag="pull_request.review_submitted"):
    review_id: int
    verdict: ReviewVerdictName
    comments: int  # line comments that came with it


class PullRequestReviewRequested(PullRequestPayload, frozen=True, tag="pull_request.review_requested"):
    """Reviews were requested (`POST .../requested_reviewers`): the people and bots newly asked."""

    requested_reviewers: list[AccountRef]


class PullRequestMerged(PullRequestPayload, frozen=True, tag="pull_request.merged"):
    strategy: MergedHowName
    merge_commit_sha: str


class PullRequestClosed(PullRequestPayload, frozen=True, tag="pull_request.closed"):
    pass


class PullRequestReopened(PullRequestPayload, frozen=True, tag="pull_request.reopened"):
    pass


class EgressBlocked(Payload, frozen=True, tag="egress.blocked"):
    """A request of a run's sandbox that the egress proxy refused (docs/egress.md)."""

    host: str
    port: int
    method: str  # "CONNECT" for a tunnel (https), else the plain-HTTP method
    rules: Literal["allow-list", "address", "request", "limit"]
    reason: str
    phase: Literal["run", "environment"] = "run"  # who asked: the run's sandbox, or the environment's setup


class PolicyBypassed(Payload, frozen=True, tag="policy.bypassed"):
    """A tool call the agent ran without forgehand's allow decision: the run fails `policy_bypass`
    and its work stays unmerged on the task branch (docs/security.md, "Verify, do not trust")."""

    tool_use_id: str
    tool_name: str
    tool_input: Any
    reason: str


class _ToolRun(Payload, frozen=True):
    """A custom tool's run for a task's agent (docs/tools.md); an admin's test run sends none."""

    tool_run_id: int
    tool: str  # its name; agents call it custom_<tool>
    tool_id: int
    version: int
    inputs_hash: str
    state: str


class ToolRunQueued(_ToolRun, frozen=True, tag="tool_run.queued"):
    """A call was validated and allowed: it runs now (`auto`) or waits for a person (`approval`,
    state `awaiting_approval`)."""


class ToolRunStarted(_ToolRun, frozen=True, tag="tool_run.started"):
    pass


class ToolRunFinished(_ToolRun, frozen=True, tag="tool_run.finished"):
    exit_code: int | None
    failure_reason: str | None
    output_tail: str  # the last 4 KiB of the output, redacted


class Ping(Payload, frozen=True, tag="ping"):
    hook_id: int
    url: str
    events: list[str]
    kind: Literal["policy", "notify"]


EventPayload = (
    TaskCreated
    | ToolRunQueued
    | ToolRunStarted
    | ToolRunFinished
    | TaskStateChanged
    | RunStarted
    | RunFinished
    | ApprovalRequested
    | ApprovalResolved
    | ReviewSubmitted
    | TaskMerged
    | TaskProgress
    | RepoPushed
    | StatusCreated
    | PullRequestOpened
    | PullRequestSynchronized
    | PullRequestReviewSubmitted
    | PullRequestReviewRequested
    | PullRequestMerged
    | PullRequestClosed
    | PullRequestReopened
    | IssueOpened
    | IssueEdited
    | IssueClosed
    | IssueReopened
    | IssueLabeled
    | IssueAssigned
    | CommentCreated
    | CommentEdited
    | CommentDeleted
    | ScheduleTriggered
    | EgressBlocked
    | PolicyBypassed
    | Ping
)

PAYLOADS: dict[EventType, type[Payload]] = {
    cast(EventType, p.__struct_config__.tag): p
    for p in (
        TaskCreated,
        TaskStateChanged,
        RunStarted,
        RunFinished,
        ApprovalRequested,
        ApprovalResolved,
        ReviewSubmitted,
        TaskMerged,
        TaskProgress,
        RepoPushed,
        StatusCreated,
        PullRequestOpened,
        PullRequestSynchronized,
        PullRequestReviewSubmitted,
        PullRequestReviewRequested,
        PullRequestMerged,
        PullRequestClosed,
        PullRequestReopened,
        IssueOpened,
        IssueEdited,
        IssueClosed,
        IssueReopened,
        IssueLabeled,
        IssueAssigned,
        CommentCreated,
        CommentEdited,
        CommentDeleted,
        ScheduleTriggered,
        EgressBlocked,
        PolicyBypassed,
        ToolRunQueued,
        ToolRunStarted,
        ToolRunFinished,
        Ping,
    )
}


def data_of(payload: Payload) -> dict[str, Any]:
    """The payload as the notification's `data`: JSON builtins, the tag left out."""
    data: dict[str, Any] = msgspec.to_builtins(payload)
    del data["type"]
    return data


class Event(msgspec.Struct, frozen=True, kw_only=True):
    repo_id: int | None  # None for instance-wide events (ping of an instance endpoint)
    repo_uuid: str = ""
    repository: str = ""  # owner/name
    task: TaskRef | None = None
    run: RunRef | None = None
    actor: AccountRef | None = None
    agent: AccountRef | None = None
    data: EventPayload
    # Stable across retries and redeliveries: consumers deduplicate on it.
    id: str = msgspec.field(default_factory=lambda: str(uuid.uuid4()))
    at: datetime = msgspec.field(default_factory=utcnow)

    @property
    def type(self) -> EventType:
        return self.data.type


Subscriber = Callable[[AsyncSession, Event], Awaitable[None]]


class EventBus:
    """Synchronous, in-transaction fan-out to subscribers. A subscriber that raises aborts the
    change it reports (the transaction rolls back): nothing is published that did not happen,
    nothing happens that is not published."""

    def __init__(self) -> None:
        self._subscribers: list[Subscriber] = []

    def subscribe(self, subscriber: Subscriber) -> None:
        self._subscribers.append(subscriber)

    async def publish(self, session: AsyncSession, event: Event) -> None:
        for subscriber in self._subscribers:
            await subscriber(session, event)
