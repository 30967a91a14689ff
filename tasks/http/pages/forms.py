"""The task pages' forms (URL-encoded), and how each becomes the API's input shape."""

from typing import Literal

import msgspec

from forge.errors import InvalidInput
from tasks.core.schemas import ApprovalDecide, MergeCreate, ReviewCommentCreate, ReviewCreate, RuntimeName, TaskCreate
from tasks.core.states import ReviewVerdict


class StartForm(msgspec.Struct, kw_only=True):
    goal: str = ""
    agent: str = ""
    runtime: str = "command"
    command: str = ""
    base: str = ""
    title: str = ""
    csrf_token: str = ""


class BodyForm(msgspec.Struct, kw_only=True):
    body: str = ""
    csrf_token: str = ""


class DecisionForm(msgspec.Struct, kw_only=True):
    decision: str = ""
    reason: str = ""
    input_hash: str = ""
    csrf_token: str = ""


class ReviewForm(msgspec.Struct, kw_only=True):
    verdict: str = ReviewVerdict.COMMENT.value
    body: str = ""
    # One inline comment (the per-line form), optional.
    path: str = ""
    side: str = "head"
    line: str = ""
    comment: str = ""
    commit_sha: str = ""
    csrf_token: str = ""


class MergeForm(msgspec.Struct, kw_only=True):
    strategy: str = "merge"
    expected_head_sha: str = ""
    csrf_token: str = ""


_RUNTIMES: dict[str, RuntimeName] = {"builtin": "builtin", "command": "command", "claude-code": "claude-code"}


def task_create(data: StartForm) -> TaskCreate:
    command: str | None = data.command if data.runtime == "command" else None
    return TaskCreate(
        goal=data.goal[:20_000],
        agent=data.agent.strip()[:40] or "-",
        runtime=_RUNTIMES.get(data.runtime, "builtin"),
        command=command,
        base=data.base.strip()[:255],
        title=data.title.strip()[:200],
    )


def approval_decide(data: DecisionForm) -> ApprovalDecide:
    if data.decision == "approve":
        choice: Literal["approve", "deny"] = "approve"
    elif data.decision == "deny":
        choice = "deny"
    else:
        raise InvalidInput("choose approve or deny", code="invalid_decision")
    return ApprovalDecide(decision=choice, reason=data.reason[:2000], input_hash=data.input_hash[:64])


def review_create(form: ReviewForm) -> ReviewCreate:
    try:
        verdict = ReviewVerdict(form.verdict)
    except ValueError:
        verdict = ReviewVerdict.COMMENT
    comments = []
    if form.path and form.line.isascii() and form.line.isdigit() and form.comment.strip():
        side: Literal["base", "head"] = "base" if form.side == "base" else "head"
        comments.append(
            ReviewCommentCreate(path=form.path[:4096], line=int(form.line[:9]), side=side, body=form.comment[:20_000])
        )
    return ReviewCreate(verdict=verdict, body=form.body[:50_000], commit_sha=form.commit_sha[:64], comments=comments)


def merge_create(form: MergeForm) -> MergeCreate:
    strategy: Literal["merge", "squash", "fast-forward"] = (
        "squash" if form.strategy == "squash" else "fast-forward" if form.strategy == "fast-forward" else "merge"
    )
    return MergeCreate(strategy=strategy, expected_head_sha=form.expected_head_sha[:64])
