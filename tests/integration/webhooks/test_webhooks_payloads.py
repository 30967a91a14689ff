"""One event of every notification type through the outbox path (bus -> `OutboxWriter` -> outbox
row, and `service.ping`): the envelope's `data` has the documented shape, key for key and in
order, the tag never leaks into it, it decodes back to the payload it came from, and the table in
docs/webhooks.md matches the structs."""

import json
import uuid
from pathlib import Path
from typing import Any

import msgspec
import pytest
from sqlalchemy import select

from forge.core.settings import Settings
from forge.db.audit import Actor
from forge.db.engine import Database
from forge.db.events import (
    PAYLOADS,
    AccountRef,
    ApprovalRequested,
    ApprovalResolved,
    EgressBlocked,
    Event,
    EventBus,
    EventPayload,
    Ping,
    PolicyBypassed,
    PullBranch,
    PullRequestClosed,
    PullRequestMerged,
    PullRequestOpened,
    PullRequestReopened,
    PullRequestReviewRequested,
    PullRequestReviewSubmitted,
    PullRequestSynchronized,
    PushedRef,
    RepoPushed,
    ReviewComment,
    ReviewSubmitted,
    RunFinished,
    RunRef,
    RunStarted,
    StatusCreated,
    TaskCreated,
    TaskMerged,
    TaskProgress,
    TaskRef,
    TaskStateChanged,
    ToolRunFinished,
    ToolRunQueued,
    ToolRunStarted,
)
from forge.db.issue_payloads import (
    CommentCreated,
    CommentDeleted,
    CommentEdited,
    CommentPayload,
    CommentTarget,
    IssueAssigned,
    IssueChanges,
    IssueClosed,
    IssueEdited,
    IssueLabeled,
    IssueOpened,
    IssuePayload,
    IssueReopened,
    LabelRef,
    ScheduleTriggered,
)
from forge.db.models import Repository
from forge.db.payload_base import CommentRef, NumberRef, ScheduleRef, TriggerRef
from tests.support.payloads import doc_rows, payload_rows, render_rows
from tests.support.webhooks import config, make_endpoint, make_repo
from webhooks import service
from webhooks.core.models import WebhookEndpoint, WebhookOutbox
from webhooks.delivery.outbox import OutboxWriter
from webhooks.sdk.protocol import NOTIFY_EVENTS

SHA_A, SHA_B, ZEROS = "a" * 40, "b" * 40, "0" * 40
APPROVAL: dict[str, Any] = {
    "approval_id": "2b1f0c3e-0000-4000-8000-000000000001",
    "tool_use_id": "call_1",
    "tool_name": "bash",
    "tool_input": {"command": "make deploy", "env": {"X": 1}},
    "input_hash": "c" * 64,
    "reason": "deploys need a person",
    "held": False,
    "requested_by": "https://hooks.example.com/policy",
    "expires_at": "2026-12-01T10:30:00+00:00",
}

PULL: dict[str, Any] = {
    "number": 4,
    "title": "Price is ten",
    "html_url": "http://forge.example/ana/shop/pull/4",
    "state": "open",
    "draft": False,
    "head": PullBranch(ref="feature/x", sha=SHA_B),
    "base": PullBranch(ref="main", sha=SHA_A),
    "author": AccountRef(login="ana"),
}
PULL_DATA: dict[str, Any] = {
    **PULL,
    "head": {"ref": "feature/x", "sha": SHA_B},
    "base": {"ref": "main", "sha": SHA_A},
    "author": {"login": "ana", "type": "User"},
}

ISSUE: dict[str, Any] = {
    "number": 5,
    "title": "Login fails",
    "body": "Steps: ...",
    "html_url": "http://forge.example/ana/shop/issues/5",
    "state": "open",
    "state_reason": None,
    "author": AccountRef(login="rita"),
    "labels": [LabelRef(name="bug", color="d73a4a")],
    "assignees": [AccountRef(login="demo-agent", type="Bot")],
    "milestone": "v1",
}
ISSUE_DATA: dict[str, Any] = {
    **ISSUE,
    "author": {"login": "rita", "type": "User"},
    "labels": [{"name": "bug", "color": "d73a4a"}],
    "assignees": [{"login": "demo-agent", "type": "Bot"}],
}
COMMENT: dict[str, Any] = {
    "id": 9,
    "body": "@demo-agent please add tests",
    "html_url": "http://forge.example/ana/shop/issues/5#issuecomment-9",
    "author": AccountRef(login="ana"),
    "issue": CommentTarget(number=5, title="Login fails", html_url="http://forge.example/ana/shop/issues/5"),
}
COMMENT_DATA: dict[str, Any] = {
    **COMMENT,
    "author": {"login": "ana", "type": "User"},
    "issue": {
        "number": 5, "title": "Login fails", "html_url": "http://forge.example/ana/shop/issues/5",
        "is_pull_request": False,
    },
}  # fmt: skip
SCHEDULE: dict[str, Any] = {
    "schedule_id": 2, "name": "nightly", "cron": "0 3 * * *", "timezone": "Europe/Berlin", "skipped": True,
    "reason": "the previous task (#7) is still running",
}  # fmt: skip
# Events of a repository rather than of a task: `meta.task` is null.
REPO_EVENTS = (RepoPushed, StatusCreated, IssuePayload, CommentPayload, ScheduleTriggered)

# (payload, the `data` object a consumer receives: the documented shape, in wire order)
CASES: list[tuple[EventPayload, dict[str, Any]]] = [
    (TaskCreated(), {}),
    (
        TaskStateChanged(from_=None, to="queued", queue_position=1),
        {"from": None, "to": "queued", "queue_position": 1},
    ),
    (TaskStateChanged(from_="queued", to="running"), {"from": "queued", "to": "running"}),
    (
        TaskStateChanged(from_="queued", to="queued", queue_position=None),
        {"from": "queued", "to": "queued", "queue_position": None},
    ),
    (
        TaskStateChanged(from_="running", to="failed", failure_reason="timeout", error="ran for 1 h"),
        {"from": "running", "to": "failed", "failure_reason": "timeout", "error": "ran for 1 h"},
    ),
    (RunStarted(kind="start"), {"kind": "start"}),
    (
        RunFinished(kind="review", state="failed", exit_code=2, failure_reason="exit_code", error="exit 2", end_sha=""),
        {
            "kind": "review",
            "state": "failed",
            "exit_code": 2,
            "failure_reason": "exit_code",
            "error": "exit 2",
            "end_sha": "",
        },
    ),
    (
        RunFinished(kind="start", state="succeeded", exit_code=None, failure_reason=None, error="", end_sha=SHA_A),
        {
            "kind": "start",
            "state": "succeeded",
            "exit_code": None,
            "failure_reason": None,
            "error": "",
            "end_sha": SHA_A,
        },
    ),
    (ApprovalRequested(**APPROVAL, state="pending"), {**APPROVAL, "state": "pending"}),
    (ApprovalResolved(**APPROVAL, state="expired"), {**APPROVAL, "state": "expired"}),
    (
        ApprovalResolved(**APPROVAL, state="denied", decision_reason="not today"),
        {**APPROVAL, "state": "denied", "decision_reason": "not today"},
    ),
    (
        ReviewSubmitted(
            review_id="2b1f0c3e-0000-4000-8000-000000000002",
            verdict="request_changes",
            body="close, but",
            commit_sha=SHA_A,
            comments=[ReviewComment(path="src/a.py", side="head", line=3, body="off by one")],
        ),
        {
            "review_id": "2b1f0c3e-0000-4000-8000-000000000002",
            "verdict": "request_changes",
            "body": "close, but",
            "commit_sha": SHA_A,
            "comments": [{"path": "src/a.py", "side": "head", "line": 3, "body": "off by one"}],
        },
    ),
    (
        TaskMerged(
            strategy="squash",
            base="main",
            base_sha_before=SHA_A,
            merged_sha=SHA_B,
            head="agent/1-fix",
            head_sha=SHA_A,
            approvals=["wendy"],
            branch_deleted=True,
        ),
        {
            "strategy": "squash",
            "base": "main",
            "base_sha_before": SHA_A,
            "merged_sha": SHA_B,
            "head": "agent/1-fix",
            "head_sha": SHA_A,
            "approvals": ["wendy"],
            "branch_deleted": True,
        },
    ),
    (TaskProgress(message="tests pass; writing the docs"), {"message": "tests pass; writing the docs"}),
    (
        RepoPushed(refs=[PushedRef(ref="refs/heads/main", before=ZEROS, after=SHA_B)]),
        {"refs": [{"ref": "refs/heads/main", "before": ZEROS, "after": SHA_B}]},
    ),
    (
        StatusCreated(
            id=7, sha=SHA_B, state="success", context="ci/build", description="", target_url="", combined="pending"
        ),
        {
            "id": 7,
            "sha": SHA_B,
            "state": "success",
            "context": "ci/build",
            "description": "",
            "target_url": "",
            "combined": "pending",
        },
    ),
    (PullRequestOpened(**PULL), PULL_DATA),
    (
        PullRequestSynchronized(**PULL, before=SHA_A, dismissed_reviews=1),
        {**PULL_DATA, "before": SHA_A, "dismissed_reviews": 1},
    ),
    (
        PullRequestReviewSubmitted(**PULL, review_id=3, verdict="approve", comments=0),
        {**PULL_DATA, "review_id": 3, "verdict": "approve", "comments": 0},
    ),
    (
        PullRequestReviewRequested(**PULL, requested_reviewers=[AccountRef(login="demo-agent", type="Bot")]),
        {**PULL_DATA, "requested_reviewers": [{"login": "demo-agent", "type": "Bot"}]},
    ),
    (
        PullRequestMerged(**{**PULL, "state": "merged"}, strategy="squash", merge_commit_sha=SHA_B),
        {**PULL_DATA, "state": "merged", "strategy": "squash", "merge_commit_sha": SHA_B},
    ),
    (
        PullRequestClosed(**{**PULL, "state": "closed", "author": None}),
        {**PULL_DATA, "state": "closed", "author": None},
    ),
    (PullRequestReopened(**PULL), PULL_DATA),
    (IssueOpened(**ISSUE), ISSUE_DATA),
    (
        IssueEdited(**ISSUE, changes=IssueChanges(title="Login fail")),
        {**ISSUE_DATA, "changes": {"title": "Login fail"}},
    ),
    (
        IssueClosed(**{**ISSUE, "state": "closed", "state_reason": "completed"}, closed_by_pull_request=6),
        {**ISSUE_DATA, "state": "closed", "state_reason": "completed", "closed_by_pull_request": 6},
    ),
    (
        IssueReopened(**{**ISSUE, "state_reason": "reopened"}),
        {**ISSUE_DATA, "state_reason": "reopened"},
    ),
    (
        IssueLabeled(**ISSUE, label=LabelRef(name="bug", color="d73a4a")),
        {**ISSUE_DATA, "label": {"name": "bug", "color": "d73a4a"}},
    ),
    (
        IssueAssigned(**ISSUE, assignee=AccountRef(login="demo-agent", type="Bot")),
        {**ISSUE_DATA, "assignee": {"login": "demo-agent", "type": "Bot"}},
    ),
    (CommentCreated(**COMMENT), COMMENT_DATA),
    (
        CommentEdited(**COMMENT, body_before="@demo-agent add tests"),
        {**COMMENT_DATA, "body_before": "@demo-agent add tests"},
    ),
    (CommentDeleted(**COMMENT), COMMENT_DATA),
    (ScheduleTriggered(**SCHEDULE), SCHEDULE),
    (
        EgressBlocked(host="example.com", port=443, method="CONNECT", rules="allow-list", reason="no rule allows it"),
        {
            "host": "example.com",
            "port": 443,
            "method": "CONNECT",
            "rules": "allow-list",
            "reason": "no rule allows it",
            "phase": "run",
        },
    ),
    (
        PolicyBypassed(tool_use_id="toolu_1", tool_name="Bash", tool_input={"command": "ls"}, reason="no decision"),
        {"tool_use_id": "toolu_1", "tool_name": "Bash", "tool_input": {"command": "ls"}, "reason": "no decision"},
    ),
    *(
        (
            cls(tool_run_id=7, tool="run_tests", tool_id=3, version=2, inputs_hash="ab" * 32, state=state),
            {
                "tool_run_id": 7,
                "tool": "run_tests",
                "tool_id": 3,
                "version": 2,
                "inputs_hash": "ab" * 32,
                "state": state,
            },
        )
        for cls, state in ((ToolRunQueued, "awaiting_approval"), (ToolRunStarted, "running"))
    ),
    (
        ToolRunFinished(
            tool_run_id=7,
            tool="run_tests",
            tool_id=3,
            version=2,
            inputs_hash="ab" * 32,
            state="failed",
            exit_code=1,
            failure_reason="exit_status",
            output_tail="FAILED test_x",
        ),
        {
            "tool_run_id": 7,
            "tool": "run_tests",
            "tool_id": 3,
            "version": 2,
            "inputs_hash": "ab" * 32,
            "state": "failed",
            "exit_code": 1,
            "failure_reason": "exit_status",
            "output_tail": "FAILED test_x",
        },
    ),
]

DOCS = Path(__file__).resolve().parents[3] / "docs" / "webhooks.md"


@pytest.fixture
async def repo(db: Database) -> Repository:
    return await make_repo(db)


async def outbox_bodies(db: Database) -> list[dict[str, Any]]:
    async with db.session() as s:
        rows = (await s.execute(select(WebhookOutbox).order_by(WebhookOutbox.id))).scalars()
        return [json.loads(r.body) for r in rows]


def check_data(payload: EventPayload, body: dict[str, Any], expected: dict[str, Any]) -> None:
    data = body["data"]
    assert body["type"] == payload.type
    assert list(data.items()) == list(expected.items())  # same keys, same values, same order
    assert "type" not in data  # the union's tag is the envelope's `type`, never part of `data`
    assert msgspec.convert({**data, "type": body["type"]}, EventPayload) == payload


async def test_every_type_reaches_the_envelope_in_its_documented_shape(
    db: Database, settings: Settings, repo: Repository
) -> None:
    cfg = config(settings)
    endpoint, _ = await make_endpoint(db, cfg, repo, "http://127.0.0.1:1/all", events=list(NOTIFY_EVENTS))
    bus = EventBus()
    bus.subscribe(OutboxWriter(cfg))
    task = TaskRef(id=str(uuid.uuid4()), number=1)
    async with db.session(write=True) as s:
        for payload, _ in CASES:
            pushed = isinstance(payload, REPO_EVENTS)  # repository events: no task
            await bus.publish(
                s,
                Event(
                    repo_id=repo.id,
                    repo_uuid=repo.uuid,
                    repository=f"ana/{repo.name}",
                    task=None if pushed else task,
                    run=RunRef(id=str(uuid.uuid4()), seq=1)
                    if isinstance(
                        payload,
                        RunStarted
                        | RunFinished
                        | EgressBlocked
                        | PolicyBypassed
                        | ToolRunQueued
                        | ToolRunStarted
                        | ToolRunFinished,
                    )
                    else None,
                    data=payload,
                ),
            )
    bodies = await outbox_bodies(db)
    assert len(bodies) == len(CASES)
    for (payload, expected), body in zip(CASES, bodies, strict=True):
        check_data(payload, body, expected)
        of_task = {"id": task.id, "number": 1, "url": "", "parent": None, "trigger": None}
        assert body["meta"]["task"] == (None if isinstance(payload, REPO_EVENTS) else of_task)

    async with db.session(write=True) as s:  # ping goes through the service, not the bus
        row = await service.ping(s, Actor.system("t"), cfg, repo, await s.get(WebhookEndpoint, endpoint.id))  # type: ignore[arg-type]
        body = json.loads(row.body)
    expected = {
        "hook_id": endpoint.id,
        "url": "http://127.0.0.1:1/all",
        "events": list(NOTIFY_EVENTS),
        "kind": "notify",
    }
    check_data(Ping(hook_id=endpoint.id, url=endpoint.url, events=list(NOTIFY_EVENTS), kind="notify"), body, expected)
    assert {b["type"] for b in [*bodies, body]} == set(NOTIFY_EVENTS) == set(PAYLOADS)


def test_the_docs_table_matches_the_payload_structs() -> None:
    documented = doc_rows(DOCS.read_text(), "### Payloads")
    assert documented == payload_rows(), "docs/webhooks.md, Payloads, should read:\n" + render_rows()


def test_an_event_has_the_type_of_its_payload() -> None:
    for etype, struct in PAYLOADS.items():
        fields = {f.name for f in msgspec.structs.fields(struct)}
        assert "type" not in fields  # the tag field is reserved for the tag
        assert struct.__struct_config__.tag == etype
    e = Event(repo_id=None, data=Ping(hook_id=1, url="https://h", events=["ping"], kind="notify"))
    assert e.type == "ping"
    with pytest.raises(msgspec.ValidationError):  # a payload decodes only with a tag it knows
        msgspec.convert({"type": "task.renamed"}, EventPayload)


async def test_meta_task_says_what_started_a_task(db: Database, settings: Settings, repo: Repository) -> None:
    """`meta.task.trigger`: null for a task a person started, else its kind and what it concerns."""
    cfg = config(settings)
    await make_endpoint(db, cfg, repo, "http://127.0.0.1:1/all", events=["task.created"])
    bus = EventBus()
    bus.subscribe(OutboxWriter(cfg))
    triggers = [
        TriggerRef(kind="schedule", schedule=ScheduleRef(id=3, name="nightly")),
        TriggerRef(kind="issue", issue=NumberRef(number=5)),
        TriggerRef(kind="mention", comment=CommentRef(id=9), pull_request=NumberRef(number=4)),
        TriggerRef(kind="review_request", pull_request=NumberRef(number=4)),
    ]
    async with db.session(write=True) as s:
        for n, trigger in enumerate(triggers, 1):
            task = TaskRef(id=str(uuid.uuid4()), number=n, trigger=trigger)
            await bus.publish(s, Event(repo_id=repo.id, repo_uuid=repo.uuid, task=task, data=TaskCreated()))
    seen = [b["meta"]["task"]["trigger"] for b in await outbox_bodies(db)]
    nothing = {"issue": None, "pull_request": None, "comment": None, "schedule": None}
    assert seen == [
        {"kind": "schedule", **nothing, "schedule": {"id": 3, "name": "nightly"}},
        {"kind": "issue", **nothing, "issue": {"number": 5}},
        {"kind": "mention", **nothing, "pull_request": {"number": 4}, "comment": {"id": 9}},
        {"kind": "review_request", **nothing, "pull_request": {"number": 4}},
    ]
