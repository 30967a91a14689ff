"""The vocabulary of notifications: why one came (its `reason`, GitHub's names where the concept is
the same), what it is about (its subject), where it goes (a person's channel for a reason) and how
closely a repository is watched."""

from typing import Literal, get_args

Reason = Literal[
    "task",  # your task needs you: a question, an approval, work awaiting your review
    "review_requested",  # you were asked to review a pull request
    "assign",  # you were assigned an issue
    "mention",  # you were @mentioned
    "author",  # activity on an issue or pull request you opened
    "state_change",  # a thread you take part in was closed, reopened or merged
    "comment",  # a comment or review on a thread you take part in
    "subscribed",  # a repository you watch (all activity)
]
# The stronger reason wins when one change concerns a person twice (a mention of the author).
REASONS: tuple[Reason, ...] = get_args(Reason)
# What "participating" (the inbox filter) means: everything but watching a repository.
PARTICIPATING: frozenset[str] = frozenset(REASONS) - {"subscribed"}
# Reasons a person gets whatever thread they unfollowed: they are about them.
DIRECT: frozenset[str] = frozenset({"task", "review_requested", "assign", "mention"})

REASON_LABELS: dict[str, str] = {
    "task": "Your tasks need you (a question, an approval, work to review)",
    "review_requested": "You are asked to review a pull request",
    "assign": "You are assigned an issue",
    "mention": "You are @mentioned",
    "author": "Activity on issues and pull requests you opened",
    "state_change": "Threads you take part in are closed, reopened or merged",
    "comment": "Comments and reviews on threads you take part in",
    "subscribed": "New issues, pull requests and comments in repositories you watch",
}

SubjectType = Literal["issue", "pull_request", "task"]
# As GitHub's notification `subject.type` spells them.
SUBJECT_WIRE: dict[str, str] = {"issue": "Issue", "pull_request": "PullRequest", "task": "Task"}
# The path segment of a subject in API and page URLs.
SUBJECT_PATHS: dict[str, str] = {"issue": "issues", "pull_request": "pulls", "task": "tasks"}

Channel = Literal["off", "web", "email"]
CHANNELS: tuple[Channel, ...] = get_args(Channel)

WatchLevel = Literal["all", "participating", "ignore"]
WATCH_LEVELS: tuple[WatchLevel, ...] = get_args(WatchLevel)
DEFAULT_WATCH: WatchLevel = "participating"


def stronger(a: str, b: str) -> str:
    """The reason that says more about the person (earlier in `REASONS`)."""
    return a if REASONS.index(a) <= REASONS.index(b) else b
