"""The event payloads (`forge.db.events`) the task system publishes, built from its rows.

The rows keep states and kinds as plain strings; each goes through its enum here, so a value
outside the contract fails loudly instead of reaching consumers. An enum's `.value` is typed as
the Literal of its members, so mypy checks that the enums and the Literals forge declares (forge
may not import tasks) agree; tests/unit/forge/db/test_event_payloads.py checks it at run time too."""

from collections.abc import Sequence
from typing import Any, Literal, cast

from msgspec import UNSET, UnsetType

from forge.db import events
from tasks.core.models import Approval, Review, ReviewComment, Run
from tasks.core.states import ApprovalState, FailureReason, ReviewVerdict, RunKind, RunState, TaskState


def task_state(value: str) -> events.TaskStateName:
    return TaskState(value).value


def failure_reason(value: str) -> events.FailureReasonName:
    return FailureReason(value).value


def state_changed(
    old: TaskState | None,
    new: TaskState,
    *,
    queue_position: int | UnsetType | None = UNSET,
    reason: str = "",
    error: str = "",
) -> events.TaskStateChanged:
    """`from`/`to`; `queue_position` when queued; `failure_reason` and `error` when a failure has a reason."""
    failed = new is TaskState.FAILED and bool(reason)
    return events.TaskStateChanged(
        from_=task_state(old) if old is not None else None,
        to=task_state(new),
        queue_position=queue_position,
        failure_reason=failure_reason(reason) if failed else UNSET,
        error=error if failed else UNSET,
    )


def run_started(run: Run) -> events.RunStarted:
    return events.RunStarted(kind=RunKind(run.kind).value)


def run_finished(run: Run) -> events.RunFinished:
    return events.RunFinished(
        kind=RunKind(run.kind).value,
        state=RunState(run.state).value,
        exit_code=run.exit_code,
        failure_reason=failure_reason(run.failure_reason) if run.failure_reason else None,
        error=run.error,
        end_sha=run.end_sha,
    )


def _approval(a: Approval) -> dict[str, Any]:
    """The fields both approval payloads share."""
    return {
        "approval_id": a.uuid,
        "tool_use_id": a.tool_use_id,
        "tool_name": a.tool_name,
        "tool_input": a.tool_input,
        "input_hash": a.input_hash,
        "reason": a.reason,
        "held": a.held,
        "requested_by": a.requested_by,
        "expires_at": a.expires_at.isoformat(),
    }


def approval_requested(a: Approval) -> events.ApprovalRequested:
    if ApprovalState(a.state) is not ApprovalState.PENDING:
        raise ValueError(f"approval {a.uuid} is {a.state}, not pending")
    return events.ApprovalRequested(
        **_approval(a),
        state="pending",
    )


def approval_resolved(a: Approval, *, decision_reason: str | UnsetType = UNSET) -> events.ApprovalResolved:
    """A decided, expired or cancelled approval; `decision_reason` when a person decided."""
    state = ApprovalState(a.state)
    if state is ApprovalState.PENDING:
        raise ValueError(f"approval {a.uuid} is still pending")
    return events.ApprovalResolved(
        **_approval(a),
        state=cast(events.ApprovalDecidedName, state.value),
        decision_reason=decision_reason,
    )


def review_submitted(review: Review, comments: Sequence[ReviewComment]) -> events.ReviewSubmitted:
    return events.ReviewSubmitted(
        review_id=review.uuid,
        verdict=ReviewVerdict(review.verdict).value,
        body=review.body,
        commit_sha=review.commit_sha,
        comments=[events.ReviewComment(path=c.path, side=_side(c.side), line=c.line, body=c.body) for c in comments],
    )


def _side(side: str) -> Literal["base", "head"]:
    if side not in ("base", "head"):
        raise ValueError(f"unknown diff side {side!r}")
    return cast(Literal["base", "head"], side)


def merged_how(strategy: str | None) -> events.MergedHowName:
    if strategy not in ("merge", "squash", "fast-forward", "already_merged"):
        raise ValueError(f"unknown merge strategy {strategy!r}")
    return cast(events.MergedHowName, strategy)
