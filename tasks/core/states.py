"""Task, run, approval and review-verdict states: one enum each, and the one place where task
transitions are checked."""

from enum import StrEnum

from forge.core.errors import InvalidState


class TaskState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    BLOCKED = "blocked"
    AWAITING_REVIEW = "awaiting_review"
    FAILED = "failed"
    STOPPED = "stopped"
    MERGED = "merged"
    CLOSED = "closed"

    @property
    def is_terminal(self) -> bool:
        """Nothing more happens to the task (merged, closed)."""
        return self in _TERMINAL

    @property
    def is_active(self) -> bool:
        """A run is waiting for a worker or running (queued, running)."""
        return self in _ACTIVE

    @property
    def is_resting(self) -> bool:
        """Nothing happens until a person acts: the live stream ends here."""
        return not self.is_active


_TERMINAL = frozenset({TaskState.MERGED, TaskState.CLOSED})
_ACTIVE = frozenset({TaskState.QUEUED, TaskState.RUNNING})

# The graph of docs/design.md ("The task life"). `queued -> stopped` is a stop before a worker took the run;
# `blocked -> queued` is an answer (its run waits for a worker), `blocked -> stopped` a stop.
TRANSITIONS: dict[TaskState, frozenset[TaskState]] = {
    TaskState.QUEUED: frozenset({TaskState.RUNNING, TaskState.STOPPED, TaskState.FAILED}),
    TaskState.RUNNING: frozenset(
        {TaskState.AWAITING_REVIEW, TaskState.BLOCKED, TaskState.FAILED, TaskState.STOPPED, TaskState.QUEUED}
    ),
    TaskState.BLOCKED: frozenset({TaskState.RUNNING, TaskState.QUEUED, TaskState.STOPPED, TaskState.FAILED}),
    TaskState.AWAITING_REVIEW: frozenset({TaskState.RUNNING, TaskState.QUEUED, TaskState.MERGED, TaskState.CLOSED}),
    TaskState.FAILED: frozenset({TaskState.QUEUED, TaskState.CLOSED}),
    TaskState.STOPPED: frozenset({TaskState.QUEUED, TaskState.CLOSED}),
    TaskState.MERGED: frozenset(),
    TaskState.CLOSED: frozenset(),
}


def can_transition(old: TaskState, new: TaskState) -> bool:
    return new in TRANSITIONS[old]


def check_transition(old: TaskState | str, new: TaskState) -> None:
    """Raise InvalidState unless `old -> new` is an edge of the graph."""
    old = TaskState(old)
    if not can_transition(old, new):
        raise InvalidState(f"a {old.value} task cannot become {new.value}", code="invalid_task_state")


class RunState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    BLOCKED = "blocked"  # ended with a question for a person
    FAILED = "failed"
    STOPPED = "stopped"
    CANCELLED = "cancelled"  # stopped before a worker took it

    @property
    def is_active(self) -> bool:
        return self in (RunState.QUEUED, RunState.RUNNING)


class RunKind(StrEnum):
    START = "start"
    MESSAGE = "message"
    ANSWER = "answer"
    RETRY = "retry"
    REVIEW = "review"
    APPROVAL = "approval"  # resumes after a person decided a parked tool call


class FailureReason(StrEnum):
    """Why a run failed, typed (the message beside it is for people)."""

    WORKSPACE = "workspace"
    IMAGE_MISSING = "image_missing"
    ENGINE_UNAVAILABLE = "engine_unavailable"
    MODEL_UNREACHABLE = "model_unreachable"
    MODEL_ERROR = "model_error"
    # The gateway's URL guard refused the run's model endpoint (not on the model allow-list).
    MODEL_ENDPOINT_REFUSED = "model_endpoint_refused"
    TURN_LIMIT = "turn_limit"
    TOKEN_BUDGET = "token_budget"
    TIMEOUT = "timeout"
    IDLE = "idle"
    OOM = "oom"
    DISK_LIMIT = "disk_limit"
    INTERRUPTED = "interrupted"
    POLICY = "policy"
    # A tool call ran without forgehand's allow decision (the agent's stream showed its result).
    POLICY_BYPASS = "policy_bypass"
    APPROVAL_EXPIRED = "approval_expired"
    EXIT_CODE = "exit_code"
    # A CLI agent (claude-code) exited without its final `result` line (crashed, killed mid-turn).
    AGENT_NO_RESULT = "agent_no_result"
    # A CLI agent still ran after its final `result` line and was killed.
    AGENT_LINGERED = "agent_lingered"
    SNAPSHOT_TOO_LARGE = "snapshot_too_large"
    SNAPSHOT_FAILED = "snapshot_failed"
    # The settle step itself failed (the run's end could not be recorded as it happened).
    SETTLE_FAILED = "settle_failed"
    # The repository's environment could not be built: its declaration refused, its setup failed
    # or hung, a setup secret missing (docs/environments.md).
    ENVIRONMENT_SETUP = "environment_setup"
    # The environment's setup left a setup-only secret in what would have been the image.
    SECRET_IN_ENVIRONMENT = "secret_in_environment"
    INTERNAL = "internal"


class ApprovalState(StrEnum):
    """A parked tool call: waiting for a person, then decided, expired or cancelled (a stop)."""

    PENDING = "pending"
    APPROVED = "approved"
    DENIED = "denied"
    EXPIRED = "expired"
    CANCELLED = "cancelled"


class ReviewVerdict(StrEnum):
    APPROVE = "approve"
    REQUEST_CHANGES = "request_changes"
    COMMENT = "comment"


class ToolRunState(StrEnum):
    """A custom tool's run (docs/tools.md): an `approval` tool's call waits for a person; approved
    exactly once it is `queued`, then `running`, then finished one of three ways."""

    AWAITING_APPROVAL = "awaiting_approval"
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    DENIED = "denied"
    EXPIRED = "expired"
    CANCELLED = "cancelled"

    @property
    def is_final(self) -> bool:
        return self not in (ToolRunState.AWAITING_APPROVAL, ToolRunState.QUEUED, ToolRunState.RUNNING)
