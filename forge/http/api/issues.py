"""REST: issues, their comments, labels, assignees and timeline, and the repository's labels and
milestones, at GitHub's paths and in its shapes (forge/repos/issues.py and beside it;
docs/issues.md)."""

from typing import Annotated, Literal

from litestar import Controller, delete, get, patch, post, put
from litestar.params import FromPath, JSONBody, QueryParameter

from forge.core.error_codes import Code
from forge.core.errors import NotFound
from forge.http.deps import ActorDep, IssueCommentsDep, IssuesDep, LabelsDep, PathRepoDep
from forge.repos.issue_base import parse_number
from forge.repos.issue_shapes import (
    AssigneesBody,
    CommentCreate,
    CommentRead,
    EditRead,
    IssueCreate,
    IssueRead,
    IssueUpdate,
    LabelCreate,
    LabelRead,
    LabelsBody,
    LabelUpdate,
    MilestoneCreate,
    MilestoneRead,
    MilestoneUpdate,
    TimelineRead,
)
from forge.repos.issues import IssueFilter

REPO = "/api/v1/repos/{owner:str}/{name:str}"
StateQuery = Annotated[Literal["open", "closed", "all"], QueryParameter(name="state")]
PageQuery = Annotated[int, QueryParameter(ge=1, le=100_000)]
PerPageQuery = Annotated[int, QueryParameter(ge=1, le=100)]
LoginQuery = Annotated[str | None, QueryParameter(max_length=40)]
LabelsQuery = Annotated[str | None, QueryParameter(name="labels", max_length=1000)]
MilestoneQuery = Annotated[int | None, QueryParameter(ge=1, le=1_000_000_000)]
TextQuery = Annotated[str, QueryParameter(max_length=200)]
SortQuery = Annotated[Literal["created", "updated", "comments"], QueryParameter()]
DirectionQuery = Annotated[Literal["asc", "desc"], QueryParameter()]


def _comment_id(raw: str) -> int:
    if not raw.isascii() or not raw.isdigit() or len(raw) > 12:
        raise NotFound("no such comment", code=Code.COMMENT_NOT_FOUND)
    return int(raw)


class IssueController(Controller):
    path = REPO + "/issues"
    tags = ["issues"]

    @post("/", summary="Open an issue (labels, assignees and milestone need the write role)", status_code=201)
    async def create(
        self, actor: ActorDep, path_repo: PathRepoDep, issues: IssuesDep, data: JSONBody[IssueCreate]
    ) -> IssueRead:
        res = await path_repo.load()
        return await issues.read(res, await issues.open(actor, res, data))

    @get("/", summary="Issues, with GitHub's filters (state, labels, assignee, creator, milestone) and q")
    async def list_issues(
        self,
        path_repo: PathRepoDep,
        issues: IssuesDep,
        state_: StateQuery = "open",
        labels_: LabelsQuery = None,
        assignee: LoginQuery = None,
        creator: LoginQuery = None,
        milestone: MilestoneQuery = None,
        q: TextQuery = "",
        sort: SortQuery = "created",
        direction: DirectionQuery = "desc",
        page: PageQuery = 1,
        per_page: PerPageQuery = 30,
    ) -> list[IssueRead]:
        res = await path_repo.load()
        wanted = tuple(n for n in (labels_ or "").split(",") if n.strip())[:10]
        f = IssueFilter(
            state=state_, labels=wanted, assignee=assignee, author=creator, milestone=milestone,
            q=q, sort=sort, direction=direction, page=page, per_page=per_page,
        )  # fmt: skip
        return await issues.reads(res, await issues.page(res, f))

    @get("/{number:str}", summary="One issue")
    async def get_one(self, path_repo: PathRepoDep, issues: IssuesDep, number: FromPath[str]) -> IssueRead:
        res = await path_repo.load()
        return await issues.read(res, await issues.get(res, parse_number(number)))

    @patch("/{number:str}", summary="Edit the title or body; close (with a state_reason) or reopen; labels, assignees")
    async def edit(
        self,
        actor: ActorDep,
        path_repo: PathRepoDep,
        issues: IssuesDep,
        number: FromPath[str],
        data: JSONBody[IssueUpdate],
    ) -> IssueRead:
        res = await path_repo.load()
        return await issues.read(res, await issues.update(actor, res, parse_number(number), data))

    @get("/{number:str}/edits", summary="The issue's edit history: each title and body an edit replaced")
    async def edits(
        self, path_repo: PathRepoDep, issues: IssuesDep, issue_comments: IssueCommentsDep, number: FromPath[str]
    ) -> list[EditRead]:
        res = await path_repo.load()
        return await issue_comments.issue_edits(await issues.get(res, parse_number(number)))

    @get("/{number:str}/comments", summary="The issue's comments, oldest first")
    async def comments(
        self, path_repo: PathRepoDep, issues: IssuesDep, issue_comments: IssueCommentsDep, number: FromPath[str]
    ) -> list[CommentRead]:
        res = await path_repo.load()
        return await issue_comments.all(res, await issues.get(res, parse_number(number)))

    @post("/{number:str}/comments", summary="Comment on the issue", status_code=201)
    async def comment(
        self,
        actor: ActorDep,
        path_repo: PathRepoDep,
        issues: IssuesDep,
        issue_comments: IssueCommentsDep,
        number: FromPath[str],
        data: JSONBody[CommentCreate],
    ) -> CommentRead:
        res = await path_repo.load()
        issue = await issues.get(res, parse_number(number))
        made = await issue_comments.create(actor, res, issue, data.body)
        return (await issue_comments.reads(res, issue, [made]))[0]

    @get("/{number:str}/timeline", summary="Comments and events (labeled, assigned, closed, cross-referenced...)")
    async def timeline(
        self, path_repo: PathRepoDep, issues: IssuesDep, issue_comments: IssueCommentsDep, number: FromPath[str]
    ) -> list[TimelineRead]:
        res = await path_repo.load()
        issue = await issues.get(res, parse_number(number))
        return await issue_comments.timeline(res, issue, path_repo.principal)

    @post("/{number:str}/assignees", summary="Add assignees (people or bots)", status_code=201)
    async def assign(
        self,
        actor: ActorDep,
        path_repo: PathRepoDep,
        issues: IssuesDep,
        number: FromPath[str],
        data: JSONBody[AssigneesBody],
    ) -> IssueRead:
        res = await path_repo.load()
        return await issues.read(res, await issues.add_assignees(actor, res, parse_number(number), data.assignees))

    @delete("/{number:str}/assignees", summary="Remove assignees", status_code=200)
    async def unassign(
        self,
        actor: ActorDep,
        path_repo: PathRepoDep,
        issues: IssuesDep,
        number: FromPath[str],
        data: JSONBody[AssigneesBody],
    ) -> IssueRead:
        res = await path_repo.load()
        issue = await issues.remove_assignees(actor, res, parse_number(number), data.assignees)
        return await issues.read(res, issue)

    @get("/{number:str}/labels", summary="The issue's labels")
    async def labels(self, path_repo: PathRepoDep, issues: IssuesDep, number: FromPath[str]) -> list[LabelRead]:
        res = await path_repo.load()
        return (await issues.read(res, await issues.get(res, parse_number(number)))).labels

    @post("/{number:str}/labels", summary="Add labels", status_code=200)
    async def add_labels(
        self,
        actor: ActorDep,
        path_repo: PathRepoDep,
        issues: IssuesDep,
        number: FromPath[str],
        data: JSONBody[LabelsBody],
    ) -> list[LabelRead]:
        res = await path_repo.load()
        issue = await issues.add_labels(actor, res, parse_number(number), data.labels)
        return (await issues.read(res, issue)).labels

    @put("/{number:str}/labels", summary="Replace the labels", status_code=200)
    async def set_labels(
        self,
        actor: ActorDep,
        path_repo: PathRepoDep,
        issues: IssuesDep,
        number: FromPath[str],
        data: JSONBody[LabelsBody],
    ) -> list[LabelRead]:
        res = await path_repo.load()
        issue = await issues.update(actor, res, parse_number(number), IssueUpdate(labels=data.labels))
        return (await issues.read(res, issue)).labels

    @delete("/{number:str}/labels/{label:str}", summary="Remove a label", status_code=200)
    async def remove_label(
        self, actor: ActorDep, path_repo: PathRepoDep, issues: IssuesDep, number: FromPath[str], label: FromPath[str]
    ) -> list[LabelRead]:
        res = await path_repo.load()
        issue = await issues.remove_label(actor, res, parse_number(number), label)
        return (await issues.read(res, issue)).labels


class IssueCommentController(Controller):
    path = REPO + "/issues/comments"
    tags = ["issues"]

    @get("/{comment_id:str}", summary="One issue comment")
    async def get_one(
        self, path_repo: PathRepoDep, issue_comments: IssueCommentsDep, comment_id: FromPath[str]
    ) -> CommentRead:
        res = await path_repo.load()
        comment, issue = await issue_comments.find(res, _comment_id(comment_id))
        return (await issue_comments.reads(res, issue, [comment]))[0]

    @patch("/{comment_id:str}", summary="Edit a comment (its author; the text replaced is kept)")
    async def edit(
        self,
        actor: ActorDep,
        path_repo: PathRepoDep,
        issue_comments: IssueCommentsDep,
        comment_id: FromPath[str],
        data: JSONBody[CommentCreate],
    ) -> CommentRead:
        res = await path_repo.load()
        comment = await issue_comments.edit(actor, res, _comment_id(comment_id), data.body)
        _, issue = await issue_comments.find(res, comment.id)
        return (await issue_comments.reads(res, issue, [comment]))[0]

    @delete("/{comment_id:str}", summary="Delete a comment (its author or a repository admin)", status_code=204)
    async def remove(
        self, actor: ActorDep, path_repo: PathRepoDep, issue_comments: IssueCommentsDep, comment_id: FromPath[str]
    ) -> None:
        res = await path_repo.load()
        await issue_comments.delete(actor, res, _comment_id(comment_id))

    @get("/{comment_id:str}/edits", summary="A comment's edit history, newest first")
    async def edits(
        self, path_repo: PathRepoDep, issue_comments: IssueCommentsDep, comment_id: FromPath[str]
    ) -> list[EditRead]:
        res = await path_repo.load()
        return await issue_comments.edits(res, _comment_id(comment_id))


class LabelController(Controller):
    path = REPO + "/labels"
    tags = ["issues"]

    @get("/", summary="The repository's labels")
    async def list_labels(self, path_repo: PathRepoDep, repo_labels: LabelsDep) -> list[LabelRead]:
        res = await path_repo.load()
        return [repo_labels.read(res, label) for label in await repo_labels.all(res)]

    @post("/", summary="Create a label", status_code=201)
    async def create(
        self, actor: ActorDep, path_repo: PathRepoDep, repo_labels: LabelsDep, data: JSONBody[LabelCreate]
    ) -> LabelRead:
        res = await path_repo.load()
        return repo_labels.read(res, await repo_labels.create(actor, res, data))

    @get("/{label:str}", summary="One label")
    async def get_one(self, path_repo: PathRepoDep, repo_labels: LabelsDep, label: FromPath[str]) -> LabelRead:
        res = await path_repo.load()
        return repo_labels.read(res, await repo_labels.find(res, label))

    @patch("/{label:str}", summary="Rename a label or change its colour or description")
    async def edit(
        self,
        actor: ActorDep,
        path_repo: PathRepoDep,
        repo_labels: LabelsDep,
        label: FromPath[str],
        data: JSONBody[LabelUpdate],
    ) -> LabelRead:
        res = await path_repo.load()
        return repo_labels.read(res, await repo_labels.update(actor, res, label, data))

    @delete("/{label:str}", summary="Delete a label (it leaves every issue)", status_code=204)
    async def remove(
        self, actor: ActorDep, path_repo: PathRepoDep, repo_labels: LabelsDep, label: FromPath[str]
    ) -> None:
        res = await path_repo.load()
        await repo_labels.delete(actor, res, label)


class MilestoneController(Controller):
    path = REPO + "/milestones"
    tags = ["issues"]

    @get("/", summary="Milestones (state: open, closed or all), with their progress")
    async def list_milestones(
        self, path_repo: PathRepoDep, repo_labels: LabelsDep, state_: StateQuery = "open"
    ) -> list[MilestoneRead]:
        res = await path_repo.load()
        return await repo_labels.milestone_reads(res, await repo_labels.milestones(res, state_))

    @post("/", summary="Create a milestone", status_code=201)
    async def create(
        self, actor: ActorDep, path_repo: PathRepoDep, repo_labels: LabelsDep, data: JSONBody[MilestoneCreate]
    ) -> MilestoneRead:
        res = await path_repo.load()
        return (await repo_labels.milestone_reads(res, [await repo_labels.create_milestone(actor, res, data)]))[0]

    @get("/{number:int}", summary="One milestone")
    async def get_one(self, path_repo: PathRepoDep, repo_labels: LabelsDep, number: FromPath[int]) -> MilestoneRead:
        res = await path_repo.load()
        return (await repo_labels.milestone_reads(res, [await repo_labels.milestone(res, number)]))[0]

    @patch("/{number:int}", summary="Edit, close or reopen a milestone")
    async def edit(
        self,
        actor: ActorDep,
        path_repo: PathRepoDep,
        repo_labels: LabelsDep,
        number: FromPath[int],
        data: JSONBody[MilestoneUpdate],
    ) -> MilestoneRead:
        res = await path_repo.load()
        return (await repo_labels.milestone_reads(res, [await repo_labels.update_milestone(actor, res, number, data)]))[
            0
        ]

    @delete("/{number:int}", summary="Delete a milestone (its issues keep no milestone)", status_code=204)
    async def remove(
        self, actor: ActorDep, path_repo: PathRepoDep, repo_labels: LabelsDep, number: FromPath[int]
    ) -> None:
        res = await path_repo.load()
        await repo_labels.delete_milestone(actor, res, number)
