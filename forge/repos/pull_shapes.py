"""The wire shapes of pull requests, their reviews and comments: GitHub's field names where the
concept is the same (`head.ref`, `base.ref`, `mergeable`, `draft`, `merged_at`, reviews'
`event`/`state`), so existing clients read them unchanged (docs/pulls.md)."""

from datetime import datetime
from typing import Annotated, Literal

import msgspec

from forge.db.events import AccountRef
from forge.git.merge import MergeStrategy

MAX_TITLE = 256
MAX_BODY = 65_536
Title = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_TITLE)]
Body = Annotated[str, msgspec.Meta(max_length=MAX_BODY)]
Branch = Annotated[str, msgspec.Meta(min_length=1, max_length=255)]
ReviewEvent = Literal["APPROVE", "REQUEST_CHANGES", "COMMENT"]
ReviewState = Literal["APPROVED", "CHANGES_REQUESTED", "COMMENTED", "DISMISSED", "PENDING"]
Side = Literal["LEFT", "RIGHT"]
#: `clean` mergeable now; `blocked` a branch rule is unmet; `dirty` conflicts; `draft`; `unknown`
#: not computed (lists); `closed` no longer open.
MergeableState = Literal["clean", "blocked", "dirty", "draft", "unknown", "closed"]


class PullCreate(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    title: Title
    head: Branch  # the branch with the changes
    base: Branch  # the branch they go into
    body: Body = ""
    draft: bool = False


class PullUpdate(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    title: Title | None = None
    body: Body | None = None
    state: Literal["open", "closed"] | None = None
    base: Branch | None = None
    draft: bool | None = None


class PullMergeRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    strategy: MergeStrategy = "merge"
    # The head the caller reviewed: a different current head is refused (`head_moved`).
    sha: Annotated[str, msgspec.Meta(max_length=64)] | None = None
    commit_title: Annotated[str, msgspec.Meta(max_length=MAX_TITLE)] | None = None
    commit_message: Body | None = None


class UpdateBranchRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    # The head the caller saw: refused with `head_moved` when the branch moved since.
    expected_head_sha: Annotated[str, msgspec.Meta(max_length=64)] | None = None


class PullReviewCommentCreate(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    path: Annotated[str, msgspec.Meta(min_length=1, max_length=4096)]
    line: Annotated[int, msgspec.Meta(ge=1, le=10_000_000)]
    body: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_BODY)]
    side: Side = "RIGHT"


class PullReviewCreate(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    # No event: a pending review only its author sees, published later with a verdict (as GitHub).
    event: ReviewEvent | None = None
    body: Body = ""
    # The head the reviewer read: a review of an older head is refused (`head_moved`).
    commit_id: Annotated[str, msgspec.Meta(max_length=64)] | None = None
    comments: Annotated[list[PullReviewCommentCreate], msgspec.Meta(max_length=100)] = []


class PendingReviewSubmit(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The verdict that publishes a pending review, with its comments."""

    event: ReviewEvent
    body: Body = ""


class ReviewDismissal(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    message: Annotated[str, msgspec.Meta(min_length=1, max_length=1000)]


class PullCommentCreate(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A comment on the conversation, on a line of the diff when `path` and `line` are given, or a
    reply in the thread of a line comment (`in_reply_to`: its id; the thread's line is kept)."""

    body: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_BODY)]
    path: Annotated[str, msgspec.Meta(min_length=1, max_length=4096)] | None = None
    line: Annotated[int, msgspec.Meta(ge=1, le=10_000_000)] | None = None
    side: Side = "RIGHT"
    in_reply_to: Annotated[int, msgspec.Meta(ge=1, le=2_147_483_647)] | None = None


class ReviewersRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    reviewers: Annotated[list[Annotated[str, msgspec.Meta(max_length=40)]], msgspec.Meta(max_length=20)]


class PullBranchRead(msgspec.Struct, kw_only=True):
    label: str  # owner:branch, as GitHub writes it
    ref: str
    sha: str  # "" once the branch is gone


class PullRead(msgspec.Struct, kw_only=True):
    id: int
    number: int
    url: str
    html_url: str
    state: Literal["open", "closed"]  # a merged pull request is closed with `merged: true`
    title: str
    body: str
    user: AccountRef | None
    draft: bool
    head: PullBranchRead
    base: PullBranchRead
    merged: bool
    merged_at: datetime | None
    merged_by: AccountRef | None
    merge_commit_sha: str | None
    created_at: datetime
    updated_at: datetime
    closed_at: datetime | None
    requested_reviewers: list[AccountRef]
    comments: int
    review_comments: int
    # Computed on a single pull request's read; null in lists (as GitHub does).
    mergeable: bool | None = None
    mergeable_state: MergeableState = "unknown"
    commits: int | None = None
    additions: int | None = None
    deletions: int | None = None
    changed_files: int | None = None
    ahead_by: int | None = None
    behind_by: int | None = None
    conflicts: list[str] | None = None  # paths that conflict with the base
    unmet_rules: list[str] | None = None  # every unmet branch rule, in words


class PullReviewRead(msgspec.Struct, kw_only=True):
    id: int
    user: AccountRef | None
    body: str
    state: ReviewState
    commit_id: str
    submitted_at: datetime
    html_url: str


class PullCommentRead(msgspec.Struct, kw_only=True):
    id: int
    user: AccountRef | None
    body: str
    path: str | None
    line: int | None
    side: Side | None
    commit_id: str
    pull_request_review_id: int | None
    # The line's head has moved on since the comment was written.
    outdated: bool
    # The lines a ```suggestion block proposes for the line (null: none); applied as a commit.
    suggestion: list[str] | None
    # A reply: the thread's first comment. A thread is resolved on its first comment.
    in_reply_to_id: int | None
    resolved: bool
    resolved_by: AccountRef | None
    created_at: datetime
    updated_at: datetime
    html_url: str
