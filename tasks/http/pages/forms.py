"""The task pages' forms (URL-encoded), and how each becomes the API's input shape."""

from typing import Literal

import msgspec

from forge.core.errors import InvalidInput
from forge.http.pages.forms import invalid_input
from tasks.core.schemas import (
    BODY_MAX,
    ApprovalDecide,
    MergeCreate,
    MessageCreate,
    ReviewCommentCreate,
    ReviewCreate,
    TaskCreate,
)
from tasks.core.states import ReviewVerdict


class StartForm(msgspec.Struct, kw_only=True):
    goal: str = ""
    agent: str = ""
    runtime: str = "command"
    command: str = ""
    agent_command: str = ""  # acp runtime: the configured agent
    base: str = ""
    title: str = ""
    on_pull_request: str = ""  # the number of the pull request to work on (its "Ask an agent")
    csrf_token: str = ""


# The start service's refusals (their codes) -> the start form's field they concern.
START_ALIASES = {
    "goal_required": "goal",
    "invalid_agent": "agent",
    "command_required": "command",
    "invalid_command": "command",
    "agent_command_required": "agent_command",
    "unknown_acp_agent": "agent_command",
    "acp_agent_unavailable": "agent_command",
    "invalid_agent_command": "agent_command",
    "model_not_configured": "runtime",
    "base_not_found": "base",
    "pull_not_open": "goal",
    "pull_not_found": "goal",
}


class BodyForm(msgspec.Struct, kw_only=True):
    body: str = ""
    csrf_token: str = ""


# The message and answer services' refusals (their codes) -> the text field (`body`).
BODY_ALIASES = {"body_required": "body", "invalid_characters": "body", "policy_denied": "body"}


# The decision's refusals (their codes) -> the reason field; the others concern the call itself.
DECISION_ALIASES = {"invalid_characters": "approval-reason", "policy_denied": "approval-reason"}


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
    # "draft": the inline comment goes onto the reviewer's pending review instead.
    mode: str = ""
    csrf_token: str = ""


class MergeForm(msgspec.Struct, kw_only=True):
    strategy: str = "merge"
    expected_head_sha: str = ""
    csrf_token: str = ""


def form_text(text: str) -> str:
    """A textarea's value as typed: browsers send its line breaks as CRLF."""
    return text.replace("\r\n", "\n")


def task_create(data: StartForm) -> TaskCreate:
    """The start form as the API's body, checked against the same schema (same limits and
    messages): an oversize goal is refused, never cut."""
    raw: dict[str, object] = {
        "goal": form_text(data.goal),
        "agent": data.agent.strip() or "-",
        "runtime": data.runtime or "command",
        "base": data.base.strip(),
        "title": data.title.strip(),
    }
    if data.runtime == "command":
        raw["command"] = form_text(data.command)
    if data.runtime == "acp":
        raw["agent_command"] = data.agent_command.strip()
    raw_pull = data.on_pull_request.strip()
    if raw_pull.isascii() and raw_pull.isdigit() and len(raw_pull) <= 9:
        raw["on_pull_request"] = int(raw_pull)
    try:
        return msgspec.convert(raw, TaskCreate)
    except msgspec.ValidationError as exc:
        raise invalid_input(exc) from None


def message_create(data: BodyForm) -> MessageCreate:
    """A message or an answer as typed (LF line breaks); an oversize one is refused, never cut."""
    body = form_text(data.body)
    if len(body) > BODY_MAX:
        raise InvalidInput(f"a message is at most {BODY_MAX:,} characters, not {len(body):,}", field="body")
    return MessageCreate(body=body)


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


def draft_comment(form: ReviewForm) -> ReviewCommentCreate:
    """The per-line form's comment for the review draft (the same checks as the API's body)."""
    raw: dict[str, object] = {"path": form.path, "side": form.side or "head", "body": form_text(form.comment)}
    if form.line.isascii() and form.line.isdigit() and len(form.line) < 10:
        raw["line"] = int(form.line)
    try:
        return msgspec.convert(raw, ReviewCommentCreate)
    except msgspec.ValidationError as exc:
        raise invalid_input(exc) from None
