"""The task system's payload builders (`tasks.core.payloads`): the `data` they give is what the
hand-built dicts gave before the payloads were typed, and forge's Literals are the enums' values."""

from datetime import UTC, datetime
from typing import Any, get_args

import pytest

from forge.db import events
from forge.db.events import TaskCreated, data_of
from tasks.core import payloads
from tasks.core.lifecycle import Lifecycle
from tasks.core.models import Approval, Review, ReviewComment, Run
from tasks.core.states import ApprovalState, FailureReason, ReviewVerdict, RunKind, RunState, TaskState


@pytest.mark.parametrize(
    ("literal", "enum"),
    [
        (events.TaskStateName, TaskState),
        (events.RunStateName, RunState),
        (events.RunKindName, RunKind),
        (events.FailureReasonName, FailureReason),
        (events.ReviewVerdictName, ReviewVerdict),
    ],
)
def test_forge_literals_are_the_enum_values(literal: Any, enum: Any) -> None:
    assert set(get_args(literal)) == {m.value for m in enum}


def test_approval_literals_split_the_approval_states() -> None:
    decided = set(get_args(events.ApprovalDecidedName))
    assert decided | {"pending"} == {m.value for m in ApprovalState} and "pending" not in decided


def test_state_changed_has_the_keys_of_each_case() -> None:
    q = payloads.state_changed(None, TaskState.QUEUED, queue_position=3)
    assert list(data_of(q).items()) == [("from", None), ("to", "queued"), ("queue_position", 3)]
    assert data_of(payloads.state_changed(TaskState.QUEUED, TaskState.QUEUED, queue_position=None)) == {
        "from": "queued",
        "to": "queued",
        "queue_position": None,
    }
    assert data_of(payloads.state_changed(TaskState.QUEUED, TaskState.RUNNING, reason="oom", error="x")) == {
        "from": "queued",
        "to": "running",
    }  # a reason counts only on a failure
    failed = payloads.state_changed(TaskState.RUNNING, TaskState.FAILED, reason="oom", error="out of memory")
    assert data_of(failed) == {"from": "running", "to": "failed", "failure_reason": "oom", "error": "out of memory"}
    assert data_of(payloads.state_changed(TaskState.RUNNING, TaskState.FAILED, error="e")) == {
        "from": "running",
        "to": "failed",
    }
    with pytest.raises(ValueError):
        payloads.state_changed(TaskState.RUNNING, TaskState.FAILED, reason="bored")


def test_run_payloads() -> None:
    run = Run(kind="start", state="succeeded", exit_code=None, failure_reason="", error="", end_sha="f" * 40)
    assert data_of(payloads.run_started(run)) == {"kind": "start"}
    assert list(data_of(payloads.run_finished(run)).items()) == [
        ("kind", "start"),
        ("state", "succeeded"),
        ("exit_code", None),
        ("failure_reason", None),
        ("error", ""),
        ("end_sha", "f" * 40),
    ]
    failed = Run(
        kind=RunKind.RETRY, state=RunState.FAILED, exit_code=3, failure_reason="exit_code", error="3", end_sha=""
    )
    assert data_of(payloads.run_finished(failed))["failure_reason"] == "exit_code"
    with pytest.raises(ValueError):
        payloads.run_started(Run(kind="nap"))


def approval(state: str) -> Approval:
    return Approval(
        uuid="u-1",
        tool_use_id="call_1",
        tool_name="bash",
        tool_input={"command": "ls"},
        input_hash="h",
        reason="ask",
        held=True,
        requested_by="https://h/p",
        state=state,
        expires_at=datetime(2026, 12, 1, 10, 30, tzinfo=UTC),
    )


def test_approval_payloads() -> None:
    before = {
        "approval_id": "u-1",
        "tool_use_id": "call_1",
        "tool_name": "bash",
        "tool_input": {"command": "ls"},
        "input_hash": "h",
        "reason": "ask",
        "held": True,
        "requested_by": "https://h/p",
        "expires_at": "2026-12-01T10:30:00+00:00",
    }
    assert list(data_of(payloads.approval_requested(approval(ApprovalState.PENDING))).items()) == [
        *before.items(),
        ("state", "pending"),
    ]
    assert data_of(payloads.approval_resolved(approval("expired"))) == {**before, "state": "expired"}
    decided = payloads.approval_resolved(approval("approved"), decision_reason="")
    assert data_of(decided) == {**before, "state": "approved", "decision_reason": ""}
    with pytest.raises(ValueError):
        payloads.approval_requested(approval("denied"))
    with pytest.raises(ValueError):
        payloads.approval_resolved(approval("pending"))


def test_review_payload() -> None:
    review = Review(uuid="r-1", verdict="comment", body="b", commit_sha="c")
    comments = [ReviewComment(path="a.py", side="base", line=2, body="why")]
    assert data_of(payloads.review_submitted(review, comments)) == {
        "review_id": "r-1",
        "verdict": "comment",
        "body": "b",
        "commit_sha": "c",
        "comments": [{"path": "a.py", "side": "base", "line": 2, "body": "why"}],
    }
    with pytest.raises(ValueError):
        payloads.review_submitted(review, [ReviewComment(path="a.py", side="left", line=2, body="")])


def test_merge_strategy_names() -> None:
    assert payloads.merged_how("already_merged") == "already_merged"
    with pytest.raises(ValueError):
        payloads.merged_how(None)


async def test_a_payload_cannot_be_published_as_another_type() -> None:
    life = Lifecycle(None, bus=events.EventBus(), base_url="")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"task\.created payload published as task\.merged"):
        await life.publish("task.merged", None, None, data=TaskCreated())  # type: ignore[arg-type]
