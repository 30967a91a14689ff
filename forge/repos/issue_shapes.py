"""The wire shapes of issues, labels, milestones, comments and the timeline: GitHub's field names
where the concept is the same (`state_reason`, `labels`, `assignees`, `milestone`, `comments`,
`user`), so existing clients read them unchanged (docs/issues.md)."""

from datetime import datetime
from typing import Annotated, Any, Literal

import msgspec

from forge.db.events import AccountRef

MAX_TITLE = 256
MAX_BODY = 65_536
MAX_ASSIGNEES = 10
MAX_LABELS = 30
Title = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_TITLE)]
Body = Annotated[str, msgspec.Meta(max_length=MAX_BODY)]
CommentBody = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_BODY)]
Login = Annotated[str, msgspec.Meta(min_length=1, max_length=40)]
LabelName = Annotated[str, msgspec.Meta(min_length=1, max_length=50)]
Color = Annotated[str, msgspec.Meta(pattern=r"^#?[0-9a-fA-F]{6}$")]
LabelDescription = Annotated[str, msgspec.Meta(max_length=200)]
MilestoneNumber = Annotated[int, msgspec.Meta(ge=1, le=1_000_000_000)]
CloseReason = Literal["completed", "not_planned", "duplicate"]
StateReason = Literal["completed", "not_planned", "duplicate", "reopened"]


class IssueCreate(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    title: Title
    body: Body = ""
    # Setting these needs the write role; from anyone else they are ignored, as on GitHub.
    labels: Annotated[list[LabelName], msgspec.Meta(max_length=MAX_LABELS)] = []
    assignees: Annotated[list[Login], msgspec.Meta(max_length=MAX_ASSIGNEES)] = []
    milestone: MilestoneNumber | None = None


class IssueUpdate(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    title: Title | None = None
    body: Body | None = None
    state: Literal["open", "closed"] | None = None
    state_reason: CloseReason | None = None
    labels: Annotated[list[LabelName], msgspec.Meta(max_length=MAX_LABELS)] | None = None
    assignees: Annotated[list[Login], msgspec.Meta(max_length=MAX_ASSIGNEES)] | None = None
    # null removes the milestone (as GitHub); so does 0; absent leaves it.
    milestone: Annotated[int, msgspec.Meta(ge=0, le=1_000_000_000)] | msgspec.UnsetType | None = msgspec.UNSET


class LabelsBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    labels: Annotated[list[LabelName], msgspec.Meta(max_length=MAX_LABELS)]


class AssigneesBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    assignees: Annotated[list[Login], msgspec.Meta(max_length=MAX_ASSIGNEES)]


class LabelCreate(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    name: LabelName
    color: Color
    description: LabelDescription = ""


class LabelUpdate(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    new_name: LabelName | None = None
    color: Color | None = None
    description: LabelDescription | None = None


class LabelRead(msgspec.Struct, kw_only=True):
    id: int
    name: str
    color: str
    description: str
    url: str


class MilestoneCreate(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    title: Annotated[str, msgspec.Meta(min_length=1, max_length=100)]
    description: Body = ""
    due_on: datetime | None = None
    state: Literal["open", "closed"] = "open"


class MilestoneUpdate(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    title: Annotated[str, msgspec.Meta(min_length=1, max_length=100)] | None = None
    description: Body | None = None
    due_on: datetime | None = None
    state: Literal["open", "closed"] | None = None


class MilestoneRead(msgspec.Struct, kw_only=True):
    id: int
    number: int
    title: str
    description: str
    state: Literal["open", "closed"]
    open_issues: int
    closed_issues: int
    due_on: datetime | None
    closed_at: datetime | None
    html_url: str


class IssueRead(msgspec.Struct, kw_only=True):
    id: int
    number: int
    title: str
    body: str
    state: Literal["open", "closed"]
    state_reason: StateReason | None
    user: AccountRef | None
    labels: list[LabelRead]
    assignees: list[AccountRef]
    milestone: MilestoneRead | None
    comments: int
    html_url: str
    created_at: datetime
    updated_at: datetime
    closed_at: datetime | None
    closed_by: AccountRef | None
    # The author could not write to the repository: an agent reads the text as untrusted.
    author_association: Literal["OWNER", "COLLABORATOR", "CONTRIBUTOR", "NONE"]
    pull_request: None = None  # issues and pull requests share numbers; this is always an issue


class CommentCreate(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    body: CommentBody


class CommentRead(msgspec.Struct, kw_only=True):
    id: int
    body: str
    user: AccountRef | None
    html_url: str
    issue_url: str
    created_at: datetime
    updated_at: datetime
    edits: int  # how many times it was edited (the history: GET .../comments/{id}/edits)


class EditRead(msgspec.Struct, kw_only=True):
    """One entry of an edit history: the text the edit replaced."""

    editor: AccountRef | None
    created_at: datetime
    title_before: str | None
    body_before: str | None


class TimelineRead(msgspec.Struct, kw_only=True):
    """One entry of an issue's timeline: a comment (`event: commented`, with `comment`) or an event
    (`labeled`, `assigned`, `closed`, `cross-referenced`, ...: GitHub's names) with its details."""

    id: str  # "comment-<id>" or "event-<id>"
    event: str
    actor: AccountRef | None
    created_at: datetime
    comment: CommentRead | None = None
    details: dict[str, Any] = {}
