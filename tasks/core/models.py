"""SQLAlchemy models of tasks: the task, its runs, its transcript, and the per-repository counter."""

import uuid as uuid_mod
from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    false,
    text,
)
from sqlalchemy.orm import Mapped, mapped_column, relationship

from forge.db.engine import Base, utcnow
from tasks.core.states import ApprovalState

SKIPPED_SAMPLE = 20  # refused paths shown in a run's JSON; the rest are paginated


def _uuid() -> str:
    return str(uuid_mod.uuid4())


class TaskCounter(Base):
    """The last task number given out in a repository. Incremented in the transaction that
    creates the task, so numbers are gap-free and unique under concurrency."""

    __tablename__ = "task_counters"

    repo_id: Mapped[int] = mapped_column(ForeignKey("repositories.id", ondelete="CASCADE"), primary_key=True)
    last_number: Mapped[int] = mapped_column(Integer, default=0)


class Task(Base):
    __tablename__ = "tasks"
    __table_args__ = (
        UniqueConstraint("repo_id", "number", name="uq_tasks_repo_number"),
        Index("ix_tasks_repo_state", "repo_id", "state"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    uuid: Mapped[str] = mapped_column(String(36), unique=True, default=_uuid)
    repo_id: Mapped[int] = mapped_column(ForeignKey("repositories.id", ondelete="CASCADE"), index=True)
    number: Mapped[int] = mapped_column(Integer)
    title: Mapped[str] = mapped_column(String(200))
    goal: Mapped[str] = mapped_column(Text)
    runtime: Mapped[str] = mapped_column(String(32))
    # For the `command` runtime: an argv list, or a string run with `bash -lc`.
    command: Mapped[Any] = mapped_column(JSON, nullable=True)
    # A repository admin's override of the environment for this task ({"image", "extra_setup"};
    # tasks/core/schemas.py EnvironmentOverride), null for none.
    environment_override: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    # The labels a worker must have to claim the task's runs (the repository's task settings' and
    # the start's `worker_labels`, fixed at start; sorted). [] for any worker.
    required_labels: Mapped[list[str]] = mapped_column(JSON, default=list, server_default=text("'[]'"))
    agent_id: Mapped[int] = mapped_column(ForeignKey("accounts.id", ondelete="RESTRICT"), index=True)
    started_by_id: Mapped[int | None] = mapped_column(
        ForeignKey("accounts.id", ondelete="SET NULL"), nullable=True, index=True
    )
    base: Mapped[str] = mapped_column(String(255))
    branch: Mapped[str] = mapped_column(String(255))
    base_sha: Mapped[str] = mapped_column(String(64), default="")
    head_sha: Mapped[str] = mapped_column(String(64), default="")
    head_is_wip: Mapped[bool] = mapped_column(Boolean, default=False)
    # Set when merged: how, by whom, the resulting commit on the base.
    merge_strategy: Mapped[str] = mapped_column(String(16), default="", server_default="")
    merged_sha: Mapped[str] = mapped_column(String(64), default="", server_default="")
    merged_by_id: Mapped[int | None] = mapped_column(ForeignKey("accounts.id", ondelete="SET NULL"), nullable=True)
    merged_at: Mapped[datetime | None] = mapped_column(nullable=True)
    state: Mapped[str] = mapped_column(String(20), index=True)
    summary: Mapped[str] = mapped_column(Text, default="")
    error: Mapped[str] = mapped_column(Text, default="")
    failure_reason: Mapped[str] = mapped_column(String(32), default="")
    question: Mapped[str] = mapped_column(Text, default="")
    # The answers the agent offered with its question (ask_user's `options`; null: free text only).
    question_options: Mapped[list[str] | None] = mapped_column(JSON, nullable=True)
    queued_message: Mapped[str] = mapped_column(Text, default="")
    # A subtask (spawn_subtask): its parent, how deep it is (0: a task a person started), and its
    # own token budget per run, carved out of the parent's (null: the repository's setting).
    parent_id: Mapped[int | None] = mapped_column(
        ForeignKey("tasks.id", ondelete="SET NULL"), nullable=True, index=True
    )
    depth: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    token_budget: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # The transcript's sequence counter: incremented (row-locked) in each writing transaction.
    last_seq: Mapped[int] = mapped_column(Integer, default=0)
    # The builtin runtime's conversation, carried from one run to the next (answer, message).
    conversation: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list)
    # A CLI agent's own session (Claude Code's session id): set by the first run, resumed by later ones.
    agent_session_id: Mapped[str] = mapped_column(String(128), default="", server_default="")
    # The pull request (its number) the task was asked to work on: it starts from its head branch.
    pull_number: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # The task's own pull request: its branch into its base, opened when it first has changes.
    result_pull_number: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # What started the task when no person's start did (tasks.core.schemas.Trigger as JSON); null:
    # a person's start.
    trigger: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)


class Run(Base):
    """One attempt: one container life."""

    __tablename__ = "task_runs"
    __table_args__ = (
        UniqueConstraint("task_id", "seq", name="uq_task_runs_task_seq"),
        Index("ix_task_runs_state_id", "state", "id"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    uuid: Mapped[str] = mapped_column(String(36), unique=True, default=_uuid)
    task_id: Mapped[int] = mapped_column(ForeignKey("tasks.id", ondelete="CASCADE"), index=True)
    repo_id: Mapped[int] = mapped_column(ForeignKey("repositories.id", ondelete="CASCADE"), index=True)
    seq: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(16))
    state: Mapped[str] = mapped_column(String(16))
    # What this run was asked (the goal, a message, an answer).
    prompt: Mapped[str] = mapped_column(Text, default="")
    requested_by_id: Mapped[int | None] = mapped_column(ForeignKey("accounts.id", ondelete="SET NULL"), nullable=True)
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    error: Mapped[str] = mapped_column(Text, default="")
    failure_reason: Mapped[str] = mapped_column(String(32), default="")
    owner: Mapped[str] = mapped_column(String(200), default="")
    heartbeat_at: Mapped[datetime | None] = mapped_column(nullable=True)
    stop_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    container_id: Mapped[str] = mapped_column(String(80), default="")
    start_sha: Mapped[str] = mapped_column(String(64), default="")
    end_sha: Mapped[str] = mapped_column(String(64), default="")
    turns: Mapped[int] = mapped_column(Integer, default=0)
    prompt_tokens: Mapped[int] = mapped_column(Integer, default=0)
    completion_tokens: Mapped[int] = mapped_column(Integer, default=0)
    # The run's summary; `summary_reported`: the agent reported it (report_summary), not extracted.
    summary: Mapped[str] = mapped_column(Text, default="", server_default="")
    summary_reported: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    # The run's snapshot found the start tree unchanged: no commit, no task branch made or moved.
    no_changes: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    # The agent CLI that ran (e.g. "claude-code", "2.1.332"); empty for the builtin runtimes.
    agent_name: Mapped[str] = mapped_column(String(64), default="", server_default="")
    agent_version: Mapped[str] = mapped_column(String(64), default="", server_default="")
    # What the model gateway metered for this run's calls (tasks/run/gateway), whatever the runtime;
    # `prompt_tokens`/`completion_tokens` stay the builtin runtime's own count.
    input_tokens: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    output_tokens: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    cache_read_tokens: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    cache_write_tokens: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    cost_micros: Mapped[int | None] = mapped_column(BigInteger, nullable=True)  # null: not priced
    model_key: Mapped[str] = mapped_column(String(16), default="", server_default="")  # instance|repository|personal
    model_provider: Mapped[str] = mapped_column(String(16), default="", server_default="")
    # The egress proxy (egress/): connections it made for this run, and requests it refused.
    egress_allowed: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    egress_blocked: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # The paths the snapshot refused: how many, the first `SKIPPED_SAMPLE` on the row (what task
    # JSON shows), and all of them in `task_run_skipped` (their own paginated endpoint). An agent
    # that writes 100,000 files would otherwise make every read of its task megabytes long.
    skipped_sample: Mapped[list[dict[str, Any]]] = mapped_column("skipped", JSON, default=list)
    skipped_count: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    skipped_rows: Mapped[list["RunSkipped"]] = relationship(
        lazy="noload", cascade="save-update, merge", passive_deletes=True
    )
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(nullable=True)

    @property
    def skipped(self) -> list[dict[str, Any]]:
        """The sample (the full list is `task_run_skipped`)."""
        return self.skipped_sample

    @skipped.setter
    def skipped(self, paths: list[dict[str, Any]]) -> None:
        """Whatever list the snapshot produced (`{path, reason, ...}` each), once per run: the
        count, the sample, and every entry as a row of its own (inserted with the run's flush)."""
        entries = [{k: str(v) for k, v in p.items()} for p in paths]
        self.skipped_count = len(entries)
        self.skipped_sample = entries[:SKIPPED_SAMPLE]
        self.skipped_rows = [
            RunSkipped(idx=i, path=e.get("path", ""), reason=e.get("reason", "")) for i, e in enumerate(entries)
        ]


class RunSkipped(Base):
    """One path a run's snapshot refused, in the order the snapshot reported it."""

    __tablename__ = "task_run_skipped"

    run_id: Mapped[int] = mapped_column(ForeignKey("task_runs.id", ondelete="CASCADE"), primary_key=True)
    idx: Mapped[int] = mapped_column(Integer, primary_key=True)
    path: Mapped[str] = mapped_column(Text)
    reason: Mapped[str] = mapped_column(Text, default="")


class TranscriptEvent(Base):
    __tablename__ = "transcript_events"
    __table_args__ = (UniqueConstraint("task_id", "seq", name="uq_transcript_events_task_seq"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    task_id: Mapped[int] = mapped_column(ForeignKey("tasks.id", ondelete="CASCADE"))
    seq: Mapped[int] = mapped_column(Integer)
    run_id: Mapped[int | None] = mapped_column(ForeignKey("task_runs.id", ondelete="CASCADE"), nullable=True)
    at: Mapped[datetime] = mapped_column(default=utcnow)
    kind: Mapped[str] = mapped_column(String(16))
    schema_version: Mapped[int] = mapped_column(Integer, default=1)
    payload: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class Approval(Base):
    """A tool call parked for a person: a policy consumer answered `ask` (or failed with failure
    policy `hold`). Bound to the exact input by its hash; approving runs exactly that input."""

    __tablename__ = "task_approvals"
    __table_args__ = (Index("ix_task_approvals_state_expires", "state", "expires_at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    uuid: Mapped[str] = mapped_column(String(36), unique=True, default=_uuid)
    task_id: Mapped[int] = mapped_column(ForeignKey("tasks.id", ondelete="CASCADE"), index=True)
    repo_id: Mapped[int] = mapped_column(ForeignKey("repositories.id", ondelete="CASCADE"), index=True)
    # The run that asked, and the run that resumed after the decision.
    run_id: Mapped[int] = mapped_column(ForeignKey("task_runs.id", ondelete="CASCADE"))
    resume_run_id: Mapped[int | None] = mapped_column(ForeignKey("task_runs.id", ondelete="SET NULL"), nullable=True)
    tool_use_id: Mapped[str] = mapped_column(String(200))
    tool_name: Mapped[str] = mapped_column(String(64))
    tool_input: Mapped[Any] = mapped_column(JSON)
    input_hash: Mapped[str] = mapped_column(String(64))
    reason: Mapped[str] = mapped_column(Text, default="")
    held: Mapped[bool] = mapped_column(Boolean, default=False)  # failure policy `hold`, not a consumer's ask
    requested_by: Mapped[str] = mapped_column(String(2048), default="")  # the endpoint URL(s)
    delivery_id: Mapped[str] = mapped_column(String(64), default="")
    state: Mapped[str] = mapped_column(String(16), default=ApprovalState.PENDING.value)
    decided_by_id: Mapped[int | None] = mapped_column(ForeignKey("accounts.id", ondelete="SET NULL"), nullable=True)
    decision_reason: Mapped[str] = mapped_column(Text, default="")
    decided_at: Mapped[datetime | None] = mapped_column(nullable=True)
    expires_at: Mapped[datetime] = mapped_column()
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Review(Base):
    """A person's (or a bot's) verdict on a task's branch, bound to the head commit it was written
    against: a later head leaves it (and its inline comments) outdated, not lost."""

    __tablename__ = "task_reviews"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    uuid: Mapped[str] = mapped_column(String(36), unique=True, default=_uuid)
    task_id: Mapped[int] = mapped_column(ForeignKey("tasks.id", ondelete="CASCADE"), index=True)
    repo_id: Mapped[int] = mapped_column(ForeignKey("repositories.id", ondelete="CASCADE"), index=True)
    author_id: Mapped[int | None] = mapped_column(ForeignKey("accounts.id", ondelete="SET NULL"), nullable=True)
    verdict: Mapped[str] = mapped_column(String(20))  # approve, request_changes, comment
    body: Mapped[str] = mapped_column(Text, default="")
    commit_sha: Mapped[str] = mapped_column(String(64))
    # request_changes: the follow-up run it started.
    run_id: Mapped[int | None] = mapped_column(ForeignKey("task_runs.id", ondelete="SET NULL"), nullable=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class ReviewComment(Base):
    """An inline comment on one line of the diff under review (`side` base: the old line number,
    head: the new one), with the quoted line so it still reads right once outdated."""

    __tablename__ = "task_review_comments"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    review_id: Mapped[int] = mapped_column(ForeignKey("task_reviews.id", ondelete="CASCADE"), index=True)
    task_id: Mapped[int] = mapped_column(ForeignKey("tasks.id", ondelete="CASCADE"), index=True)
    path: Mapped[str] = mapped_column(String(4096))
    side: Mapped[str] = mapped_column(String(8))
    line: Mapped[int] = mapped_column(Integer)
    body: Mapped[str] = mapped_column(Text)
    quoted: Mapped[str] = mapped_column(Text, default="")
    commit_sha: Mapped[str] = mapped_column(String(64))
    # The change-request run this comment was handed to (null: not yet sent to the agent).
    sent_run_id: Mapped[int | None] = mapped_column(ForeignKey("task_runs.id", ondelete="SET NULL"), nullable=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class RepoTaskSettings(Base):
    """A repository's overrides of the instance's task settings (null: use the instance's).
    Set by repository admins; the model key is stored encrypted (forge.core.security.SecretBox)."""

    __tablename__ = "repo_task_settings"

    repo_id: Mapped[int] = mapped_column(ForeignKey("repositories.id", ondelete="CASCADE"), primary_key=True)
    model_base_url: Mapped[str | None] = mapped_column(String(500), nullable=True)
    model_name: Mapped[str | None] = mapped_column(String(200), nullable=True)
    model_api_key_enc: Mapped[str | None] = mapped_column(Text, nullable=True)
    anthropic_base_url: Mapped[str | None] = mapped_column(String(500), nullable=True)
    anthropic_model: Mapped[str | None] = mapped_column(String(200), nullable=True)
    anthropic_api_key_enc: Mapped[str | None] = mapped_column(Text, nullable=True)
    # Tasks may spend the starter's personal model key (forge.db.models.ModelKey) when they have one.
    allow_personal_keys: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    turn_limit: Mapped[int | None] = mapped_column(Integer, nullable=True)
    tool_timeout_seconds: Mapped[int | None] = mapped_column(Integer, nullable=True)
    idle_seconds: Mapped[int | None] = mapped_column(Integer, nullable=True)
    wall_clock_seconds: Mapped[int | None] = mapped_column(Integer, nullable=True)
    token_budget: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # Merge rules (null: the defaults, 1 approval, anyone's, branch kept).
    required_approvals: Mapped[int | None] = mapped_column(Integer, nullable=True)
    approval_not_by_starter: Mapped[bool | None] = mapped_column(Boolean, nullable=True)
    delete_branch_on_merge: Mapped[bool | None] = mapped_column(Boolean, nullable=True)
    # An agent reviewing a pull request (a review task) may approve it (null: no).
    review_agents_may_approve: Mapped[bool | None] = mapped_column(Boolean, nullable=True)
    # The runtime of tasks an issue, a mention or a review request starts (null: builtin).
    trigger_runtime: Mapped[str | None] = mapped_column(String(16), nullable=True)
    # Part of the environment's cache key (docs/environments.md): a forced rebuild counts it up, so
    # every engine's next task builds the environment again.
    environment_generation: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # An environment declared here by a repository admin (environment.yml's text); it takes the
    # place of the repository's own file (null: the file, if any).
    environment_yml: Mapped[str | None] = mapped_column(Text, nullable=True)
    # The provider may search the web for the agent (null: the instance's task_allow_web_search).
    allow_web_search: Mapped[bool | None] = mapped_column(Boolean, nullable=True)
    # Network access through the egress proxy: {"mode": "off"|"allow-list", "rules": [...],
    # "presets": [...]} (tasks/core/egress_config.py); null: off.
    egress: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    # Subtasks an agent may spawn (null: the defaults, depth 2 and 5 children per task).
    max_subtask_depth: Mapped[int | None] = mapped_column(Integer, nullable=True)
    max_subtasks: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # Runtimes a subtask may use besides its parent's (null: the parent's only).
    subtask_runtimes: Mapped[list[str] | None] = mapped_column(JSON, nullable=True)
    # Labels every task of the repository requires of the worker that claims its runs (null: none).
    worker_labels: Mapped[list[str] | None] = mapped_column(JSON, nullable=True)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)


class MergeIntent(Base):
    """A merge about to move a base ref, committed before the compare-and-swap: recovery finishes
    it (the ref moved) or drops it (it did not) when the merging process died in between. It is
    deleted in the transaction that marks the task merged, so a merge is recorded exactly once."""

    __tablename__ = "task_merge_intents"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    task_id: Mapped[int] = mapped_column(ForeignKey("tasks.id", ondelete="CASCADE"), index=True)
    base: Mapped[str] = mapped_column(String(255))
    base_sha: Mapped[str] = mapped_column(String(64))  # the base the merge was computed from
    head_sha: Mapped[str] = mapped_column(String(64))
    strategy: Mapped[str] = mapped_column(String(16))
    actor_id: Mapped[int | None] = mapped_column(ForeignKey("accounts.id", ondelete="SET NULL"), nullable=True)
    owner: Mapped[str] = mapped_column(String(200))  # host:pid of the merging process
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Schedule(Base):
    """A recurring task of a repository: at each time of `cron` (in `timezone`) a task with these
    fields starts, as `starter` (their rights checked at each run). `next_run_at` is the slot the
    next claim waits for, moved by compare-and-swap in the transaction that starts (or skips) it."""

    __tablename__ = "task_schedules"
    __table_args__ = (
        UniqueConstraint("repo_id", "name", name="uq_task_schedules_repo_name"),
        Index("ix_task_schedules_due", "paused", "next_run_at"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    repo_id: Mapped[int] = mapped_column(ForeignKey("repositories.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(100))
    cron: Mapped[str] = mapped_column(String(100))
    timezone: Mapped[str] = mapped_column(String(64))
    goal: Mapped[str] = mapped_column(Text)
    title: Mapped[str] = mapped_column(String(200), default="")
    agent_id: Mapped[int] = mapped_column(ForeignKey("accounts.id", ondelete="CASCADE"), index=True)
    runtime: Mapped[str] = mapped_column(String(32))
    # The command runtime's command (an argv list or a `bash -lc` line), the acp runtime's agent name.
    command: Mapped[Any] = mapped_column(JSON, nullable=True)
    agent_command: Mapped[str | None] = mapped_column(String(40), nullable=True)
    base: Mapped[str] = mapped_column(String(255), default="")  # "": the default branch at each run
    paused: Mapped[bool] = mapped_column(Boolean, default=False)
    # Whose tasks the runs are: who created the schedule, or last changed what it runs.
    starter_id: Mapped[int | None] = mapped_column(ForeignKey("accounts.id", ondelete="SET NULL"), nullable=True)
    next_run_at: Mapped[datetime] = mapped_column()
    last_run_at: Mapped[datetime | None] = mapped_column(nullable=True)
    last_task_id: Mapped[int | None] = mapped_column(ForeignKey("tasks.id", ondelete="SET NULL"), nullable=True)
    last_skip_reason: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)


class EnvironmentImage(Base):
    """A local image an instance admin registered: an environment may start from it (for builtin
    and command tasks), beside the built-in images and the operator's FORGEHAND_ENVIRONMENT_EXTRA_IMAGES
    (docs/environments.md). Nothing is pulled: the image must be on each worker's engine."""

    __tablename__ = "environment_images"
    __table_args__ = (UniqueConstraint("reference", name="uq_environment_images_reference"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    reference: Mapped[str] = mapped_column(String(255))
    note: Mapped[str] = mapped_column(String(200), default="")
    created_by_id: Mapped[int | None] = mapped_column(ForeignKey("accounts.id", ondelete="SET NULL"), nullable=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
