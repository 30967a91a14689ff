"""The pieces every event payload is made of: the event types, the names of task and run states
as events spell them, who acted (`AccountRef`), what a task or run is called (`TaskRef`, `RunRef`)
and the payload base (`Payload`, a msgspec tagged struct whose tag is the event type).

`forge.db.events` holds the payloads of tasks, pushes and pull requests and the bus;
`forge.db.issue_payloads` those of issues, comments and schedules. Both build on this module."""

from typing import Literal, cast

import msgspec

from forge.core.access import Principal
from webhooks.sdk.protocol import EventType as EventType

# The event names live in the consumer SDK's protocol (the one wire contract both sides read).

# The values of the enums of tasks/core/states.py (forge may not import tasks); a unit test
# (tests/unit/forge/db/test_event_payloads.py) keeps them equal.
TaskStateName = Literal["queued", "running", "blocked", "awaiting_review", "failed", "stopped", "merged", "closed"]
RunStateName = Literal["queued", "running", "succeeded", "blocked", "failed", "stopped", "cancelled"]
RunKindName = Literal["start", "message", "answer", "retry", "review", "approval"]
FailureReasonName = Literal[
    "workspace",
    "image_missing",
    "engine_unavailable",
    "model_unreachable",
    "model_error",
    "model_endpoint_refused",
    "turn_limit",
    "token_budget",
    "timeout",
    "idle",
    "oom",
    "disk_limit",
    "interrupted",
    "policy",
    "policy_bypass",
    "approval_expired",
    "exit_code",
    "agent_no_result",
    "agent_lingered",
    "snapshot_too_large",
    "snapshot_failed",
    "settle_failed",
    "environment_setup",
    "secret_in_environment",
    "internal",
]
ApprovalDecidedName = Literal["approved", "denied", "expired", "cancelled"]
ReviewVerdictName = Literal["approve", "request_changes", "comment"]
# tasks/core/schemas.py MergeStrategyName, plus what a merge found already done.
MergedHowName = Literal["merge", "squash", "fast-forward", "already_merged"]


class AccountRef(msgspec.Struct, frozen=True, kw_only=True):
    login: str
    type: Literal["User", "Bot"] = "User"

    @classmethod
    def of(cls, principal: Principal | None) -> "AccountRef | None":
        """Who acted, as events name them; None for no account (anonymous, forgehand itself)."""
        if principal is None or principal.account_id is None:
            return None
        return cls(login=principal.login, type="Bot" if principal.type == "Bot" else "User")


class ParentRef(msgspec.Struct, frozen=True, kw_only=True):
    number: int


# What started a task other than a person's start: its bot assigned to an issue, mentioned in a
# comment, asked to review a pull request, or a schedule's time.
TriggerKind = Literal["issue", "mention", "review_request", "schedule"]


class NumberRef(msgspec.Struct, frozen=True, kw_only=True):
    number: int


class CommentRef(msgspec.Struct, frozen=True, kw_only=True):
    id: int


class ScheduleRef(msgspec.Struct, frozen=True, kw_only=True):
    id: int
    name: str


class TriggerRef(msgspec.Struct, frozen=True, kw_only=True):
    """What started a task: `kind`, and what it concerns (the others null): `issue` for `issue`,
    `comment` with `issue` or `pull_request` for `mention`, `pull_request` for `review_request`,
    `schedule` for `schedule`."""

    kind: TriggerKind
    issue: NumberRef | None = None
    pull_request: NumberRef | None = None
    comment: CommentRef | None = None
    schedule: ScheduleRef | None = None


class TaskRef(msgspec.Struct, frozen=True, kw_only=True):
    id: str  # uuid
    number: int
    url: str = ""
    # A subtask's parent task (spawned by the parent's agent); null for a task a person started.
    parent: ParentRef | None = None
    # What started the task when no person did (a schedule, an issue, a mention); null otherwise.
    trigger: TriggerRef | None = None


class RunRef(msgspec.Struct, frozen=True, kw_only=True):
    id: str  # uuid
    seq: int


class Payload(msgspec.Struct, frozen=True, kw_only=True, tag_field="type"):
    """The base of every payload: the tag (`type`) is the event type."""

    @property
    def type(self) -> EventType:
        return cast(EventType, type(self).__struct_config__.tag)
