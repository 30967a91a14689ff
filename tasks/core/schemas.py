"""Wire shapes of the tasks API (msgspec structs). New fields get defaults; types never change."""

import shlex
from datetime import datetime
from typing import Annotated, Any, Literal

import msgspec

from forge.db.payload_base import CommentRef, NumberRef, ScheduleRef, TriggerRef
from tasks.core.states import ReviewVerdict
from tasks.core.transcript import EventRead

RuntimeName = Literal["builtin", "command", "claude-code", "codex", "acp"]
# The runtimes a task started from an issue, a mention or a review request may use: those that need
# nothing beyond the goal (a command or an ACP agent's name is a person's choice, per start).
TriggerRuntimeName = Literal["builtin", "claude-code", "codex"]
GOAL_MAX = 20_000
BODY_MAX = 20_000


class EnvironmentOverride(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One task's change to its repository's environment (repository admins only): another allowed
    image, and a step run after the declared setup (docs/environments.md)."""

    image: Annotated[str, msgspec.Meta(max_length=255)] = ""
    extra_setup: Annotated[str, msgspec.Meta(max_length=64 * 1024)] = ""


class TaskCreate(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    goal: Annotated[str, msgspec.Meta(max_length=GOAL_MAX)]
    agent: Annotated[str, msgspec.Meta(min_length=1, max_length=40)]
    runtime: RuntimeName | None = None
    # `command` runtime: an argv list, or one string run with `bash -lc`.
    command: (
        Annotated[str, msgspec.Meta(max_length=10_000)]
        | Annotated[list[Annotated[str, msgspec.Meta(max_length=10_000)]], msgspec.Meta(max_length=1000)]
        | None
    ) = None
    base: Annotated[str, msgspec.Meta(max_length=255)] = ""
    title: Annotated[str, msgspec.Meta(max_length=200)] = ""
    # `acp` runtime: the name of an ACP agent the operator configured (GET /api/v1/agents).
    agent_command: Annotated[str, msgspec.Meta(max_length=40)] | None = None
    # Work on this open pull request: the task starts from its head branch, and the goal (the
    # instruction) reaches the agent with the pull request's title and description as quoted data.
    on_pull_request: Annotated[int, msgspec.Meta(ge=1, le=1_000_000_000)] | None = None
    # Repository admins only: another image or an extra setup step for this task's environment.
    environment_override: EnvironmentOverride | None = None
    # Labels the worker that claims the task's runs must have, beside the repository's
    # (`^[a-z0-9][a-z0-9_.-]{0,31}$`, at most 8 in all; checked by the start: `invalid_worker_labels`).
    worker_labels: Annotated[list[Annotated[str, msgspec.Meta(max_length=64)]], msgspec.Meta(max_length=64)] = []


class PullLink(msgspec.Struct, kw_only=True):
    number: int
    html_url: str


class Trigger(TriggerRef, frozen=True, kw_only=True):
    """What started a task when no person's start did (null on a task started by hand): stored on
    the task, shown in its JSON (`trigger`) and in every event's `meta.task.trigger`. Build one with
    the constructors; a kind without what it concerns is refused (ValueError)."""

    def __post_init__(self) -> None:
        needs = {
            "issue": self.issue is not None,
            "mention": self.comment is not None and (self.issue is None) != (self.pull_request is None),
            "review_request": self.pull_request is not None,
            "schedule": self.schedule is not None,
        }
        if not needs[self.kind]:
            raise ValueError(f"a {self.kind!r} trigger without what it concerns")

    @classmethod
    def for_issue(cls, number: int) -> "Trigger":
        """The task's bot was assigned to issue `number`."""
        return cls(kind="issue", issue=NumberRef(number=number))

    @classmethod
    def for_mention(cls, comment_id: int, *, issue: int | None = None, pull_request: int | None = None) -> "Trigger":
        """The bot was mentioned in comment `comment_id` on an issue or a pull request (one of them)."""
        return cls(
            kind="mention",
            comment=CommentRef(id=comment_id),
            issue=NumberRef(number=issue) if issue is not None else None,
            pull_request=NumberRef(number=pull_request) if pull_request is not None else None,
        )

    @classmethod
    def for_review_request(cls, pull_request: int) -> "Trigger":
        """The bot was asked to review pull request `pull_request`."""
        return cls(kind="review_request", pull_request=NumberRef(number=pull_request))

    @classmethod
    def for_schedule(cls, schedule_id: int, name: str) -> "Trigger":
        """A schedule's time came."""
        return cls(kind="schedule", schedule=ScheduleRef(id=schedule_id, name=name))


class MessageCreate(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    body: Annotated[str, msgspec.Meta(max_length=BODY_MAX)]


class ApprovalDecide(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    decision: Literal["approve", "deny"]
    reason: Annotated[str, msgspec.Meta(max_length=2000)] = ""
    # Optional binding: refuse unless the parked input still has this hash (what the person saw).
    input_hash: Annotated[str, msgspec.Meta(max_length=64)] = ""


class ApprovalRead(msgspec.Struct, kw_only=True):
    id: str
    # pending, approved, denied, expired (nobody decided in time), cancelled (the task stopped)
    state: str
    tool_use_id: str
    tool_name: str
    tool_input: dict[str, Any]
    input_hash: str  # SHA-256 of the canonical JSON of tool_input
    reason: str  # the consumer's reason, or the failure that held the call
    held: bool  # failure policy `hold` parked it (the endpoint failed), not a consumer's ask
    requested_by: str  # the endpoint URL
    run: int  # the run that asked
    created_at: datetime
    expires_at: datetime
    decided_by: str | None
    decided_at: datetime | None
    decision_reason: str


MergeStrategyName = Literal["merge", "squash", "fast-forward"]


class ReviewCommentCreate(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    path: Annotated[str, msgspec.Meta(min_length=1, max_length=4096)]
    line: Annotated[int, msgspec.Meta(ge=1, le=10_000_000)]
    body: Annotated[str, msgspec.Meta(max_length=BODY_MAX)]
    # head: a line number of the task's version (added or unchanged lines); base: of the old one.
    side: Literal["base", "head"] = "head"


class ReviewCreate(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    verdict: ReviewVerdict
    body: Annotated[str, msgspec.Meta(max_length=50_000)] = ""
    # The head commit the review was written against (default: the task's head now).
    commit_sha: Annotated[str, msgspec.Meta(max_length=64)] = ""
    comments: Annotated[list[ReviewCommentCreate], msgspec.Meta(max_length=200)] = []


class ReviewCommentRead(msgspec.Struct, kw_only=True):
    id: int
    path: str
    side: str
    line: int
    body: str
    quoted: str  # the line as it read when the comment was written
    commit_sha: str
    outdated: bool  # written against an older head than the task's


class ReviewRead(msgspec.Struct, kw_only=True):
    id: str
    verdict: str
    body: str
    author: str | None
    commit_sha: str
    outdated: bool
    created_at: datetime
    comments: list[ReviewCommentRead]
    run: int | None  # request_changes: the follow-up run it started


class ReviewDraftRead(msgspec.Struct, kw_only=True):
    """The caller's pending review: inline comments not yet published (its next review publishes
    them with its verdict). Only its author sees it."""

    comments: list[ReviewCommentRead]


class ReviewStatus(msgspec.Struct, kw_only=True):
    """What the merge rules say right now."""

    head_sha: str
    approvals: list[str]  # who approved the current head (counted ones)
    required_approvals: int
    approval_not_by_starter: bool
    change_requests: list[str]  # reviewers whose latest verdict asks for changes
    blockers: list[str]  # why a merge would be refused now (empty: the rules hold)
    # The head's combined commit status (`success`, `pending`, `failure`), null when none was reported.
    checks: Literal["success", "pending", "failure"] | None = None


class MergeCreate(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    strategy: MergeStrategyName = "merge"
    # Refuse unless the task's head is still this commit (what the person reviewed).
    expected_head_sha: Annotated[str, msgspec.Meta(max_length=64)] = ""


class UsageRead(msgspec.Struct, kw_only=True):
    """What the model gateway metered: tokens, and the cost when the model has a price
    (`FORGEHAND_MODEL_PRICES`; null when any metered call's model has none)."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    cost_usd: float | None = None


class EgressRead(msgspec.Struct, kw_only=True):
    """What the egress proxy did (docs/egress.md): connections it made, requests it refused."""

    allowed: int = 0
    blocked: int = 0


class RunRead(msgspec.Struct, kw_only=True):
    number: int
    kind: str
    state: str
    exit_code: int | None
    error: str
    failure_reason: str | None
    turns: int
    prompt_tokens: int
    completion_tokens: int
    container_id: str
    start_sha: str
    end_sha: str
    # The first paths the snapshot refused (`{path, reason}`, at most 20); all `skipped_count` of
    # them: `GET .../tasks/{n}/runs/{number}/skipped`.
    skipped: list[dict[str, str]]
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    skipped_count: int = 0
    # The run's work tree was its start tree: no commit, the task branch neither made nor moved.
    no_changes: bool = False
    # A CLI agent runtime: which agent and CLI version ran (empty for builtin and command).
    agent_name: str = ""
    agent_version: str = ""
    usage: UsageRead = msgspec.field(default_factory=UsageRead)
    # Whose key paid for the run's model calls: "instance", "repository" or "personal" (null: no model).
    model_key: str | None = None
    model_provider: str | None = None
    egress: EgressRead = msgspec.field(default_factory=EgressRead)
    # What the run reported it did; `summary_reported`: the agent said so (report_summary), rather
    # than the summary being its last words.
    summary: str = ""
    summary_reported: bool = False
    # The worker that claimed the run (its id, `host:pid:token`, also the `org.forgehand.worker`
    # label of the run's containers); null while the run is queued.
    worker: str | None = None


class SkippedPath(msgspec.Struct, kw_only=True):
    path: str
    reason: str


class SkippedPage(msgspec.Struct, kw_only=True):
    """A page of the paths a run's snapshot refused, in the order it reported them."""

    items: list[SkippedPath]
    total: int
    next_cursor: str | None  # pass as `cursor` for the next page; null on the last one


class ParentRead(msgspec.Struct, kw_only=True):
    number: int


class TaskRead(msgspec.Struct, kw_only=True):
    number: int
    repository: str
    title: str
    goal: str
    state: str
    runtime: str
    command: str | list[str] | None
    agent: str
    started_by: str | None
    base: str
    branch: str
    base_sha: str
    head_sha: str
    head_is_wip: bool
    summary: str
    error: str
    failure_reason: str | None
    question: str
    queued_message: str
    queue_position: int | None
    html_url: str
    created_at: datetime
    updated_at: datetime
    runs: list[RunRead]
    # The tool call waiting for a person, when the task is blocked on one.
    pending_approval: ApprovalRead | None = None
    # Once merged: the strategy, the resulting commit on the base, who merged it and when.
    merge_strategy: str | None = None
    merged_sha: str | None = None
    merged_by: str | None = None
    merged_at: datetime | None = None
    # The task's head is its base commit: its runs so far changed nothing (nothing to review or merge).
    no_changes: bool = False
    # A CLI agent runtime: the agent's own session id, kept across the task's runs (resume).
    agent_session_id: str | None = None
    # The sum over the task's runs, and whose key paid for its latest run that called a model.
    usage: UsageRead = msgspec.field(default_factory=UsageRead)
    model_key: str | None = None
    egress: EgressRead = msgspec.field(default_factory=EgressRead)  # summed over the task's runs
    # `acp` runtime: the configured ACP agent the task runs.
    agent_command: str | None = None
    # A subtask: the task whose agent spawned it (null: a task a person started); `subtasks` counts
    # its own (GET .../tasks/{n}/subtasks lists them).
    parent: ParentRead | None = None
    subtasks: int = 0
    # The pull request the task was asked to work on (it started from its head branch).
    on_pull_request: PullLink | None = None
    # The task's own pull request (its branch into its base), once it had changes for review.
    pull_request: PullLink | None = None
    # The answers the agent offered with its pending question (the person may still write their own).
    question_options: list[str] = msgspec.field(default_factory=list)
    # What started the task when no person did (a schedule, an issue, a mention); null otherwise.
    trigger: Trigger | None = None
    # A repository admin's change to the environment for this task; null for none.
    environment_override: EnvironmentOverride | None = None
    # The labels a worker must have to claim the task's runs (the repository's and the start's),
    # and, while the task is queued, the same labels: what its queued run waits for ([] otherwise).
    required_labels: list[str] = msgspec.field(default_factory=list)
    waiting_for_labels: list[str] = msgspec.field(default_factory=list)


class TranscriptPage(msgspec.Struct, kw_only=True):
    events: list[EventRead]
    next_after: int  # pass as `after` for the next page
    complete: bool  # no more events right now


def command_text(command: str | list[str] | None) -> str:
    """A command as a person wrote it: a command line as is (its lines kept), an argv quoted."""
    if command is None:
        return ""
    return command if isinstance(command, str) else shlex.join(command)


def argv_of(command: str | list[str] | None) -> list[str]:
    if command is None or command == "" or command == []:
        raise ValueError("the command runtime needs a command")
    if isinstance(command, str):
        return ["bash", "-lc", command]
    return list(command)
