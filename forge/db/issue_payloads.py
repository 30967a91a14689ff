"""The payloads of issues, their comments and schedules (docs/webhooks.md, section 4; docs/issues.md).

Shapes follow GitHub's `issues` and `issue_comment` events where the concept is the same: the
issue's `number`, `title`, `state` and `state_reason`, its `labels` by name and its `assignees`."""

from typing import Literal

import msgspec
from msgspec import UNSET, UnsetType

from forge.db.payload_base import AccountRef, Payload

IssueStateReason = Literal["completed", "not_planned", "duplicate", "reopened"]


class LabelRef(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    color: str  # six hex digits, no '#'


class IssuePayload(Payload, frozen=True):
    """What every `issue.*` notification says about the issue."""

    number: int
    title: str
    body: str
    html_url: str
    state: Literal["open", "closed"]
    state_reason: IssueStateReason | None
    author: AccountRef | None
    labels: list[LabelRef]
    assignees: list[AccountRef]
    milestone: str | None  # its title


class IssueOpened(IssuePayload, frozen=True, tag="issue.opened"):
    pass


class IssueChanges(msgspec.Struct, frozen=True, kw_only=True):
    """What an edit changed, each as it was before (GitHub's `changes.<field>.from`)."""

    title: str | UnsetType = UNSET
    body: str | UnsetType = UNSET


class IssueEdited(IssuePayload, frozen=True, tag="issue.edited"):
    changes: IssueChanges


class IssueClosed(IssuePayload, frozen=True, tag="issue.closed"):
    # What closed it: a person (`null`), or a merged pull request that said `Fixes #N`.
    closed_by_pull_request: int | None = None


class IssueReopened(IssuePayload, frozen=True, tag="issue.reopened"):
    pass


class IssueLabeled(IssuePayload, frozen=True, tag="issue.labeled"):
    label: LabelRef


class IssueAssigned(IssuePayload, frozen=True, tag="issue.assigned"):
    assignee: AccountRef


class CommentTarget(msgspec.Struct, frozen=True, kw_only=True):
    """The issue (or pull request) a comment is on."""

    number: int
    title: str
    html_url: str
    is_pull_request: bool = False


class CommentPayload(Payload, frozen=True):
    """What every `comment.*` notification says about the comment."""

    id: int
    body: str
    html_url: str
    author: AccountRef | None
    issue: CommentTarget


class CommentCreated(CommentPayload, frozen=True, tag="comment.created"):
    pass


class CommentEdited(CommentPayload, frozen=True, tag="comment.edited"):
    body_before: str


class CommentDeleted(CommentPayload, frozen=True, tag="comment.deleted"):
    pass


class ScheduleTriggered(Payload, frozen=True, tag="schedule.triggered"):
    """A schedule's time came: a task started (`meta.task`), or the slot was skipped (`skipped`
    with the reason, e.g. its previous task still active)."""

    schedule_id: int
    name: str
    cron: str
    timezone: str
    skipped: bool
    reason: str  # "" when a task started
