"""What a domain event means for notifications (`describe`): the thread it is about (its subject),
a line saying what happened, the text to quote and search for mentions, who it names directly
(assignees, requested reviewers, a task's starter), who starts following the thread, and whether
the thread's followers and the repository's watchers hear of it. Who is told is decided after, by
forge.notify.recipients."""

from dataclasses import dataclass, field

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from forge.db.events import (
    AccountRef,
    CommentCreated,
    CommentEdited,
    Event,
    IssueAssigned,
    IssueClosed,
    IssueEdited,
    IssueOpened,
    IssueReopened,
    PullRequestClosed,
    PullRequestMerged,
    PullRequestOpened,
    PullRequestPayload,
    PullRequestReopened,
    PullRequestReviewSubmitted,
    PullRequestSynchronized,
)
from forge.db.issue_payloads import CommentPayload, IssuePayload
from forge.db.models import PullRequest, PullReview
from forge.notify.reasons import Reason, SubjectType
from forge.notify.tasks import TaskLookup
from forge.repos.mentions import mentioned_logins

# Task states that wait for the person who started the task.
TASK_WAITS = {"blocked": "needs your answer or approval", "awaiting_review": "is ready for your review"}


@dataclass(frozen=True)
class Subject:
    """The thread a notification is about: an issue, a pull request or a task of the repository."""

    type: SubjectType
    number: int
    title: str
    url: str  # its page


@dataclass
class Activity:
    subject: Subject
    summary: str  # "bob commented on pull request #3"
    text: str = ""  # quoted in the e-mail
    link: str = ""  # where the e-mail's link goes (a comment), when not the subject's page
    mentions: list[str] = field(default_factory=list)  # logins, in order (before the cap)
    direct: list[tuple[str, Reason]] = field(default_factory=list)  # logins named by the change
    direct_ids: list[tuple[int, Reason]] = field(default_factory=list)  # accounts named by id
    follows: list[tuple[str, Reason]] = field(default_factory=list)  # logins that start following
    followers: Reason | None = None  # the thread's followers are told, with this reason
    authors_only: bool = False  # ... only those who opened it
    watchers: bool = False  # watchers of the repository (`all`) are told
    needs_write: bool = False  # the subject is visible from the write role up (tasks)


def _who(event: Event) -> str:
    return event.actor.login if event.actor is not None else "forgehand"


def _author(author: AccountRef | None) -> list[tuple[str, Reason]]:
    """The author of an issue or pull request hears of what happens to it (`author`)."""
    return [(author.login, "author")] if author is not None else []


def _issue(event: Event, data: IssuePayload) -> Activity | None:
    subject = Subject("issue", data.number, data.title, data.html_url)
    who = _who(event)
    if isinstance(data, IssueOpened):
        return Activity(
            subject,
            f"{who} opened issue #{data.number}",
            text=data.body,
            mentions=mentioned_logins(data.body),
            direct=[(a.login, "assign") for a in data.assignees],
            follows=[(data.author.login, "author")] if data.author else [],
            watchers=True,
        )
    if isinstance(data, IssueEdited) and isinstance(data.changes.body, str):
        # An edit mentions nobody: taking a login out and putting it back must not mail them again
        # and again (docs/notifications.md, "Mentions").
        return Activity(subject, f"{who} edited issue #{data.number}", text=data.body, mentions=[])
    if isinstance(data, IssueClosed | IssueReopened):
        verb = "closed" if isinstance(data, IssueClosed) else "reopened"
        return Activity(
            subject, f"{who} {verb} issue #{data.number}", direct=_author(data.author), followers="state_change",
            watchers=True,
        )  # fmt: skip
    if isinstance(data, IssueAssigned):
        return Activity(
            subject,
            f"{who} assigned issue #{data.number} to {data.assignee.login}",
            direct=[(data.assignee.login, "assign")],
        )
    return None


def _comment(event: Event, data: CommentPayload) -> Activity | None:
    kind: SubjectType = "pull_request" if data.issue.is_pull_request else "issue"
    subject = Subject(kind, data.issue.number, data.issue.title, data.issue.html_url)
    noun = "pull request" if data.issue.is_pull_request else "issue"
    who = _who(event)
    if isinstance(data, CommentCreated):
        return Activity(
            subject,
            f"{who} commented on {noun} #{data.issue.number}",
            text=data.body,
            link=data.html_url,
            mentions=mentioned_logins(data.body),
            follows=[(data.author.login, "comment")] if data.author else [],
            followers="comment",
            watchers=True,
        )
    if isinstance(data, CommentEdited):
        return Activity(subject, f"{who} edited a comment on {noun} #{data.issue.number}", text=data.body, mentions=[])
    return None


async def _pull(session: AsyncSession, event: Event, data: PullRequestPayload) -> Activity | None:
    subject = Subject("pull_request", data.number, data.title, data.html_url)
    who, n = _who(event), data.number
    if isinstance(data, PullRequestOpened):
        body = (
            await session.execute(
                select(PullRequest.body).where(PullRequest.repo_id == event.repo_id, PullRequest.number == n)
            )
        ).scalar_one_or_none() or ""
        author = [(data.author.login, "author")] if data.author else []
        return Activity(
            subject, f"{who} opened pull request #{n}", text=body, mentions=mentioned_logins(body), follows=author,  # type: ignore[arg-type]
            watchers=True,
        )  # fmt: skip
    if isinstance(data, PullRequestSynchronized):
        return Activity(
            subject, f"{who} pushed to pull request #{n}", direct=_author(data.author), followers="author",
            authors_only=True,
        )  # fmt: skip
    if isinstance(data, PullRequestReviewSubmitted):
        body = (await session.execute(select(PullReview.body).where(PullReview.id == data.review_id))).scalar() or ""
        verdict = {"approve": "approved", "request_changes": "requested changes on", "comment": "reviewed"}[
            data.verdict
        ]
        follows: list[tuple[str, Reason]] = [(event.actor.login, "comment")] if event.actor else []
        return Activity(
            subject, f"{who} {verdict} pull request #{n}", text=body, mentions=mentioned_logins(body), follows=follows,
            direct=_author(data.author), followers="comment", watchers=True,
        )  # fmt: skip
    if isinstance(data, PullRequestMerged | PullRequestClosed | PullRequestReopened):
        verb = {PullRequestMerged: "merged", PullRequestClosed: "closed", PullRequestReopened: "reopened"}[type(data)]
        return Activity(
            subject, f"{who} {verb} pull request #{n}", direct=_author(data.author), followers="state_change",
            watchers=True,
        )  # fmt: skip
    return await _review_requested(event, data, subject)


async def _review_requested(event: Event, data: PullRequestPayload, subject: Subject) -> Activity | None:
    # `pull_request.review_requested` (its payload names the reviewers asked).
    reviewers = getattr(data, "requested_reviewers", None)
    if not reviewers:
        return None
    return Activity(
        subject,
        f"{_who(event)} requested your review on pull request #{data.number}",
        direct=[(r.login, "review_requested") for r in reviewers],
    )


async def _task(session: AsyncSession, event: Event, tasks: TaskLookup) -> Activity | None:
    ref = event.task
    data = event.data
    if ref is None:
        return None
    if data.type == "task.state_changed":
        waits = TASK_WAITS.get(getattr(data, "to", ""))
    else:
        waits = "asks your approval of a tool call" if data.type == "approval.requested" else None
    if waits is None:
        return None
    found = await tasks(session, ref.id)
    if found is None or found.started_by_id is None:
        return None
    subject = Subject("task", ref.number, found.title, ref.url)
    return Activity(
        subject, f"task #{ref.number} {waits}", direct_ids=[(found.started_by_id, "task")], needs_write=True
    )


async def describe(session: AsyncSession, event: Event, tasks: TaskLookup) -> Activity | None:
    """What `event` means for notifications; None when it means nothing."""
    data = event.data
    if event.repo_id is None:
        return None
    if isinstance(data, IssuePayload):
        return _issue(event, data)
    if isinstance(data, CommentPayload):
        return _comment(event, data)
    if isinstance(data, PullRequestPayload):
        return await _pull(session, event, data)
    if data.type in ("task.state_changed", "approval.requested"):
        return await _task(session, event, tasks)
    return None
