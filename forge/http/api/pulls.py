"""REST: pull requests, their reviews, comments and review requests, at GitHub's paths and in its
shapes (forge/repos/pulls.py, pull_reviews.py, pull_merge.py; docs/pulls.md)."""

from typing import Annotated, Literal

import msgspec
from litestar import Controller, HttpMethod, delete, get, patch, post, put, route
from litestar.datastructures import State
from litestar.params import FromPath, JSONBody, QueryParameter

from forge.core.access import Action, can
from forge.db.engine import utcnow
from forge.db.events import AccountRef
from forge.http.api import pull_task_side
from forge.http.deps import (
    ActorDep,
    BaseUrlDep,
    BusDep,
    DatabaseDep,
    MergeRunnerDep,
    PathRepoDep,
    PullsDep,
    StoreDep,
    TaskWorkDep,
)
from forge.repos import pull_commits
from forge.repos.pull_commits import PullCommitRead
from forge.repos.pull_merge import MergeRunner, PullMerge
from forge.repos.pull_reviews import PullReviews
from forge.repos.pull_shapes import (
    PendingReviewSubmit,
    PullCommentCreate,
    PullCommentRead,
    PullCreate,
    PullMergeRequest,
    PullRead,
    PullReviewCreate,
    PullReviewRead,
    PullUpdate,
    ReviewDismissal,
    ReviewersRequest,
    UpdateBranchRequest,
)
from forge.repos.pull_suggestions import Suggestions
from forge.repos.pull_tasks import task_number_of
from forge.repos.pulls import Pulls, parse_number
from forge.repos.repositories import load

REPO = "/api/v1/repos/{owner:str}/{name:str}"
StateQuery = Annotated[Literal["open", "closed", "merged", "all"], QueryParameter(name="state")]
PageQuery = Annotated[int, QueryParameter(name="page", ge=1, le=100_000)]
PerPageQuery = Annotated[int, QueryParameter(name="per_page", ge=1, le=100)]
AuthorQuery = Annotated[str | None, QueryParameter(name="author", max_length=40)]
ReviewerQuery = Annotated[str | None, QueryParameter(name="reviewer", max_length=40)]


class MergeResultRead(msgspec.Struct, kw_only=True):
    """GitHub's answer to a merge."""

    sha: str
    merged: bool
    message: str


async def _merge(
    runner: MergeRunner, actor: ActorDep, owner: str, name: str, number: str, data: PullMergeRequest
) -> MergeResultRead:
    pull = await runner.merge(actor, owner, name, parse_number(number), data)
    return MergeResultRead(sha=pull.merge_commit_sha or "", merged=True, message="Pull Request successfully merged")


def _task_review_read(review_id: int, actor: ActorDep, data: PullReviewCreate, head: str, url: str) -> PullReviewRead:
    """A review of a task's pull request, as the task recorded it (without an event: the reader's
    pending review, its comments gathered in the task's review draft)."""
    states = {"APPROVE": "APPROVED", "REQUEST_CHANGES": "CHANGES_REQUESTED", "COMMENT": "COMMENTED"}
    return PullReviewRead(
        id=review_id,
        user=AccountRef.of(actor.principal),
        body=data.body,
        state=states[data.event] if data.event else "PENDING",  # type: ignore[arg-type]
        commit_id=(data.commit_id or head).strip().lower(),
        submitted_at=utcnow(),
        html_url=f"{url}#review-{review_id}",
    )


class PullController(Controller):
    path = REPO + "/pulls"
    tags = ["pull requests"]

    @post("/", summary="Open a pull request of head into base", status_code=201)
    async def create(
        self,
        actor: ActorDep,
        path_repo: PathRepoDep,
        pulls: PullsDep,
        data: JSONBody[PullCreate],
    ) -> PullRead:
        res = await path_repo.load()
        return await pulls.read(res, await pulls.open(actor, res, data))

    @get("/", summary="Pull requests, newest first (state: open, closed, merged or all)")
    async def list_pulls(
        self,
        path_repo: PathRepoDep,
        pulls: PullsDep,
        state_: StateQuery = "open",
        author: AuthorQuery = None,
        reviewer: ReviewerQuery = None,
        page: PageQuery = 1,
    ) -> list[PullRead]:
        res = await path_repo.load()
        return await pulls.reads(res, await pulls.page(res, state_, author=author, reviewer=reviewer, page=page))

    @get("/{number:str}", summary="One pull request, with mergeable, conflicts and the unmet rules")
    async def get_one(
        self,
        actor: ActorDep,
        task_work: TaskWorkDep,
        path_repo: PathRepoDep,
        pulls: PullsDep,
        number: FromPath[str],
    ) -> PullRead:
        res = await path_repo.load()
        pull = await pulls.get(res, parse_number(number))
        shape = await pulls.read(res, pull)
        task = task_number_of(pull.head_ref)
        # A task's open pull request is merged by its task's rules (as its page shows them).
        if (
            pull.state == "open"
            and task is not None
            and task_work is not None
            and can(actor.principal, Action.TASK_READ, res)
        ):
            blockers = (await task_work.side(actor, path_repo.owner, path_repo.name, task)).status.blockers
            shape.unmet_rules = blockers
            if blockers and shape.mergeable_state == "clean":
                shape.mergeable_state = "blocked"
        return shape

    @patch("/{number:str}", summary="Edit the title, body, base or draft flag; close or reopen")
    async def edit(
        self,
        actor: ActorDep,
        path_repo: PathRepoDep,
        pulls: PullsDep,
        number: FromPath[str],
        data: JSONBody[PullUpdate],
    ) -> PullRead:
        res = await path_repo.load()
        return await pulls.read(res, await pulls.edit(actor, res, parse_number(number), data))

    @get("/{number:str}/commits", summary="The commits of a pull request, oldest first (at most 250, as GitHub)")
    async def commits(
        self,
        path_repo: PathRepoDep,
        pulls: PullsDep,
        number: FromPath[str],
        page: PageQuery = 1,
        per_page: PerPageQuery = 30,
    ) -> list[PullCommitRead]:
        res = await path_repo.load()
        pull = await pulls.get(res, parse_number(number))
        return await pull_commits.page_of(pulls, res, pull, page=page, per_page=per_page)

    # The merge opens its own transactions (read, then write after the `pre_merge` question): no
    # request transaction, so no database lock is held while a policy consumer answers.
    # PUT as GitHub, POST as Gitea: one handler for both.
    @route(
        "/{number:str}/merge",
        http_method=[HttpMethod.PUT, HttpMethod.POST],
        summary="Merge (merge, squash or fast-forward) once every branch rule holds (PUT as GitHub, POST as Gitea)",
        status_code=200,
    )
    async def merge(
        self,
        actor: ActorDep,
        merge_runner: MergeRunnerDep,
        owner: FromPath[str],
        name: FromPath[str],
        number: FromPath[str],
        data: JSONBody[PullMergeRequest],
    ) -> MergeResultRead:
        return await _merge(merge_runner, actor, owner, name, number, data)

    @put("/{number:str}/update-branch", summary="Merge the base into the head branch", status_code=202)
    async def update_branch(
        self,
        actor: ActorDep,
        path_repo: PathRepoDep,
        pulls: PullsDep,
        number: FromPath[str],
        data: JSONBody[UpdateBranchRequest],
    ) -> PullRead:
        res = await path_repo.load()
        pull = await PullMerge(pulls).update_branch(actor, res, parse_number(number), data)
        return await pulls.read(res, pull)

    @get("/{number:str}/reviews", summary="The reviews of a pull request, oldest first")
    async def reviews(
        self,
        actor: ActorDep,
        task_work: TaskWorkDep,
        path_repo: PathRepoDep,
        pulls: PullsDep,
        number: FromPath[str],
    ) -> list[PullReviewRead]:
        res = await path_repo.load()
        viewer = actor.principal.account_id
        pull = await pulls.get(res, parse_number(number))
        task = task_number_of(pull.head_ref)
        # A task's pull request: the task's reviews, for those who may see tasks (the write role).
        if task is not None and task_work is not None and can(actor.principal, Action.TASK_READ, res):
            return await task_work.reviews(actor, path_repo.owner, path_repo.name, task)
        return await PullReviews(pulls).reviews(res, pull, viewer)

    @post(
        "/{number:str}/reviews",
        summary="Review: APPROVE, REQUEST_CHANGES or COMMENT, with line comments",
        status_code=200,
    )
    async def review(
        self,
        db: DatabaseDep,
        actor: ActorDep,
        bus: BusDep,
        store: StoreDep,
        forge_url: BaseUrlDep,
        task_work: TaskWorkDep,
        owner: FromPath[str],
        name: FromPath[str],
        number: FromPath[str],
        data: JSONBody[PullReviewCreate],
    ) -> PullReviewRead:
        # Transactions of its own (no request transaction): a task's pull request is reviewed
        # through its task, whose service opens its own.
        n = parse_number(number)
        async with db.session() as s:
            res = await load(s, actor.principal, owner, name)
            pull = await Pulls(s, store, bus, forge_url).get(res, n)
            task, head, url = task_number_of(pull.head_ref), pull.head_sha, f"{forge_url}/{res.full_name}/pull/{n}"
        if task is not None and task_work is not None:
            review_id = await task_work.review(actor, owner, name, task, data)
            return _task_review_read(review_id, actor, data, head, url)
        async with db.session(write=True) as s:
            res = await load(s, actor.principal, owner, name)
            pulls = Pulls(s, store, bus, forge_url)
            reviews = PullReviews(pulls)
            review = await reviews.submit(actor, res, n, data)
            pull = await pulls.get(res, n)
            return next(r for r in await reviews.reviews(res, pull, actor.principal.account_id) if r.id == review.id)

    @get("/{number:str}/comments", summary="The line comments of a pull request, oldest first")
    async def comments(
        self,
        actor: ActorDep,
        task_work: TaskWorkDep,
        path_repo: PathRepoDep,
        pulls: PullsDep,
        number: FromPath[str],
    ) -> list[PullCommentRead]:
        res = await path_repo.load()
        pull = await pulls.get(res, parse_number(number))
        found = await PullReviews(pulls).comments(res, pull, on_lines=True, viewer=actor.principal.account_id)
        task = task_number_of(pull.head_ref)
        # A task's pull request: its task's inline comments too, for those who may see tasks.
        if task is not None and task_work is not None and can(actor.principal, Action.TASK_READ, res):
            side = await task_work.side(actor, path_repo.owner, path_repo.name, task)
            found = sorted([t.comment for t in side.comments] + found, key=lambda c: c.created_at)
        return found

    @post("/{number:str}/comments", summary="Comment on the conversation, or on a line (path and line)")
    async def comment(
        self,
        state: State,
        actor: ActorDep,
        owner: FromPath[str],
        name: FromPath[str],
        number: FromPath[str],
        data: JSONBody[PullCommentCreate],
    ) -> PullCommentRead:
        # Transactions of its own: on a task's pull request a line comment is the task's.
        return await pull_task_side.comment(state, actor, owner, name, parse_number(number), data)

    @post(
        "/{number:str}/requested_reviewers", summary="Ask people or bots with write access to review", status_code=201
    )
    async def request_reviewers(
        self,
        actor: ActorDep,
        path_repo: PathRepoDep,
        pulls: PullsDep,
        number: FromPath[str],
        data: JSONBody[ReviewersRequest],
    ) -> PullRead:
        res = await path_repo.load()
        pull = await PullReviews(pulls).request(actor, res, parse_number(number), data.reviewers)
        return await pulls.read(res, pull)


class SuggestionController(Controller):
    path = REPO + "/pulls"
    tags = ["pull requests"]

    @post(
        "/{number:str}/comments/{comment_id:int}/apply-suggestion",
        summary="Commit a line comment's suggestion on the head branch",
        status_code=200,
    )
    async def apply(
        self,
        actor: ActorDep,
        path_repo: PathRepoDep,
        pulls: PullsDep,
        number: FromPath[str],
        comment_id: FromPath[int],
    ) -> PullRead:
        res = await path_repo.load()
        await Suggestions(pulls).apply(actor, res, parse_number(number), comment_id)
        return await pulls.read(res, await pulls.get(res, parse_number(number)))


async def _resolve(
    pulls: Pulls, actor: ActorDep, path_repo: PathRepoDep, number: str, comment_id: int, *, resolved: bool
) -> PullCommentRead:
    res = await path_repo.load()
    reviews = PullReviews(pulls)
    root = await reviews.resolve(actor, res, parse_number(number), comment_id, resolved=resolved)
    pull = await pulls.get(res, parse_number(number))
    return next(c for c in await reviews.comments(res, pull, viewer=actor.principal.account_id) if c.id == root.id)


class ThreadController(Controller):
    path = REPO + "/pulls/{number:str}/comments/{comment_id:int}"
    tags = ["pull requests"]

    @post("/resolve", summary="Mark a line comment's thread resolved", status_code=200)
    async def resolve(
        self,
        actor: ActorDep,
        path_repo: PathRepoDep,
        pulls: PullsDep,
        number: FromPath[str],
        comment_id: FromPath[int],
    ) -> PullCommentRead:
        return await _resolve(pulls, actor, path_repo, number, comment_id, resolved=True)

    @post("/unresolve", summary="Open a resolved thread again", status_code=200)
    async def unresolve(
        self,
        actor: ActorDep,
        path_repo: PathRepoDep,
        pulls: PullsDep,
        number: FromPath[str],
        comment_id: FromPath[int],
    ) -> PullCommentRead:
        return await _resolve(pulls, actor, path_repo, number, comment_id, resolved=False)


class PendingReviewController(Controller):
    path = REPO + "/pulls/{number:str}/reviews/{review_id:int}"
    tags = ["pull requests"]

    @post("/events", summary="Publish your pending review with a verdict", status_code=200)
    async def publish(
        self,
        state: State,
        actor: ActorDep,
        owner: FromPath[str],
        name: FromPath[str],
        number: FromPath[str],
        review_id: FromPath[int],
        data: JSONBody[PendingReviewSubmit],
    ) -> PullReviewRead:
        return await pull_task_side.publish(state, actor, owner, name, parse_number(number), review_id, data)

    @put("/dismissals", summary="Dismiss an approval or change request (repository admins)", status_code=200)
    async def dismiss(
        self,
        actor: ActorDep,
        path_repo: PathRepoDep,
        pulls: PullsDep,
        number: FromPath[str],
        review_id: FromPath[int],
        data: JSONBody[ReviewDismissal],
    ) -> PullReviewRead:
        res = await path_repo.load()
        reviews = PullReviews(pulls)
        review = await reviews.dismiss(actor, res, parse_number(number), review_id, data.message)
        pull = await pulls.get(res, parse_number(number))
        return next(r for r in await reviews.reviews(res, pull, actor.principal.account_id) if r.id == review.id)

    @delete("/", summary="Discard your pending review and its comments", status_code=204)
    async def discard(
        self, state: State, actor: ActorDep, owner: FromPath[str], name: FromPath[str], number: FromPath[str],
        review_id: FromPath[int],
    ) -> None:  # fmt: skip
        await pull_task_side.discard(state, actor, owner, name, parse_number(number), review_id)
