"""Pull requests: a proposal to merge one branch of a repository into another, reviewed and merged
the same way whoever wrote it (docs/pulls.md).

This module holds the pull request itself: open (from the compare page, a push's link or the
API), read (with its mergeability, distance and unmet rules), list, edit, close and reopen, and
what a push to its head does (`after_push`: the head recorded, stale approvals dismissed,
`pull_request.synchronized`). Reviews and comments are `forge.repos.pull_reviews`; merging and
Update branch `forge.repos.pull_merge`; what a merge needs, `forge.repos.merge_rules`.

Numbers are shared with issues (one `issue_counters` row per repository), as on GitHub and Gitea.
Reading needs read access; taking part (open, edit, review, merge) the write role. Each change is
audited (`repo.pull.*`) and published (`pull_request.*`) in its transaction."""

from dataclasses import dataclass
from typing import Literal

from sqlalchemy import func, or_, select
from sqlalchemy.exc import IntegrityError

from forge.core.access import Action, require
from forge.core.error_codes import Code
from forge.core.errors import InvalidInput, InvalidState, NotFound
from forge.core.text import one_line as one_line
from forge.db import audit
from forge.db.audit import Actor
from forge.db.engine import utcnow
from forge.db.events import AccountRef
from forge.db.models import Account, PullComment, PullRequest, PullReview, PullReviewRequest
from forge.git import InvalidRefName, validate_branch_name
from forge.git.compare import Divergence, compare, divergence
from forge.git.merge import plan_merge
from forge.git.schemas import Comparison
from forge.repos import merge_rules
from forge.repos.numbers import allocate_number
from forge.repos.pull_events import PullBase
from forge.repos.pull_shapes import MergeableState, PullBranchRead, PullCreate, PullRead, PullUpdate
from forge.repos.repositories import RepoResource, load

ListState = Literal["open", "closed", "merged", "all"]
PAGE_SIZE = 30


def task_branch(ref: str) -> bool:
    """A task's branch (`agent/...`, in any case): forgehand writes it, its task governs it."""
    return ref.casefold().startswith("agent/")


def parse_number(raw: str) -> int:
    """Pull request numbers are positive integers written plainly; anything else is 404."""
    if not raw.isascii() or not raw.isdigit() or len(raw) > 9 or int(raw) < 1:
        raise NotFound("no such pull request", code=Code.PULL_NOT_FOUND)
    return int(raw)


def _base(name: str) -> str:
    """A base branch: never an `agent/*` branch, which only its task writes."""
    base = _branch(name, "base")
    if base.casefold().startswith("agent/"):
        raise InvalidInput(
            f"{base} is written by its task only: propose changes to a task through a review of it",
            code=Code.INVALID_PULL_BRANCHES,
            field="base",
        )
    return base


def _branch(name: str, which: str) -> str:
    name = name.strip().removeprefix("refs/heads/")
    try:
        return validate_branch_name(name)
    except InvalidRefName:
        raise InvalidInput(
            f"{which} {name[:80]!r} is not a branch name", code=Code.INVALID_PULL_BRANCHES, field=which
        ) from None


@dataclass
class Pulls(PullBase):
    """The pull requests of the request's transaction."""

    # -- reading ---------------------------------------------------------------------------

    async def get(self, res: RepoResource, number: int, *, lock: bool = False) -> PullRequest:
        stmt = select(PullRequest).where(PullRequest.repo_id == res.repo.id, PullRequest.number == number)
        if lock:
            stmt = stmt.with_for_update()
        pull = (await self.session.execute(stmt)).scalar_one_or_none()
        if pull is None:
            raise NotFound(f"{res.full_name} has no pull request #{number}", code=Code.PULL_NOT_FOUND)
        return pull

    async def page(
        self, res: RepoResource, state: ListState = "open", *, author: str | None = None,
        reviewer: str | None = None, page: int = 1,
    ) -> list[PullRequest]:  # fmt: skip
        stmt = select(PullRequest).where(PullRequest.repo_id == res.repo.id)
        if state == "closed":  # GitHub's `closed` holds the merged ones too
            stmt = stmt.where(PullRequest.state.in_(("closed", "merged")))
        elif state != "all":
            stmt = stmt.where(PullRequest.state == state)
        if author:
            stmt = stmt.join(Account, Account.id == PullRequest.author_id).where(Account.login_key == author.lower())
        if reviewer:  # asked to review it, or reviewed it
            who = select(Account.id).where(Account.login_key == reviewer.strip().lower()).scalar_subquery()
            stmt = stmt.where(
                or_(
                    PullRequest.id.in_(select(PullReviewRequest.pull_id).where(PullReviewRequest.account_id == who)),
                    PullRequest.id.in_(select(PullReview.pull_id).where(PullReview.author_id == who)),
                )
            )
        stmt = stmt.order_by(PullRequest.number.desc()).offset((page - 1) * PAGE_SIZE).limit(PAGE_SIZE)
        return list((await self.session.execute(stmt)).scalars())

    async def counts(self, res: RepoResource) -> dict[str, int]:
        rows = await self.session.execute(
            select(PullRequest.state, func.count())
            .where(PullRequest.repo_id == res.repo.id)
            .group_by(PullRequest.state)
        )
        found = {state: int(n) for state, n in rows.all()}
        return {s: found.get(s, 0) for s in ("open", "closed", "merged")}

    async def reads(self, res: RepoResource, pulls: list[PullRequest]) -> list[PullRead]:
        """The API shape of a page of pull requests (no git work: `mergeable` stays null)."""
        requested = await self._requested(pulls)
        accounts = await self.accounts(
            {i for p in pulls for i in (p.author_id, p.merged_by_id) if i is not None}
            | {i for ids in requested.values() for i in ids}
        )
        counts = await self._comment_counts(pulls)
        return [
            self._read(res, p, accounts, [accounts[i] for i in requested.get(p.id, []) if i in accounts], counts)
            for p in pulls
        ]

    async def read(self, res: RepoResource, pull: PullRequest, diff: Comparison | None = None) -> PullRead:
        """One pull request in full: the branches' tips now, the distance, the diff's size,
        conflicts, and every unmet rule. `diff`: its comparison when the caller computed it already
        (the page shows it), so it is not computed twice."""
        (shape,) = await self.reads(res, [pull])
        live = await self.store.read(res.key, divergence, pull.base_ref, pull.head_ref)
        shape.ahead_by, shape.behind_by = live.ahead_by, live.behind_by
        if pull.state != "open":
            shape.mergeable_state = "closed"
            return shape
        unmet, _ = await merge_rules.unmet(self.session, res, pull, self.store)
        shape.unmet_rules = unmet
        if live.base_sha is None or not pull.head_sha:
            shape.mergeable, shape.mergeable_state = False, "blocked"
            return shape
        plan = await self.store.read(res.key, plan_merge, pull.base_ref, pull.head_sha, "merge")
        size = diff if diff is not None else await self.store.read(res.key, compare, pull.base_ref, pull.head_sha)
        shape.commits, shape.changed_files = size.ahead_by, size.stats.files
        shape.additions, shape.deletions = size.stats.additions, size.stats.deletions
        shape.conflicts = [c.path for c in plan.conflicts]
        state: MergeableState = "clean"
        if pull.draft:
            state = "draft"
        elif plan.conflicts or plan.blocker in ("merge_conflict", "unrelated_histories"):
            state = "dirty"
        elif unmet:
            state = "blocked"
        shape.mergeable = not plan.conflicts and plan.blocker not in ("merge_conflict", "unrelated_histories")
        shape.mergeable_state = state
        return shape

    def _read(
        self,
        res: RepoResource,
        p: PullRequest,
        accounts: dict[int, AccountRef],
        requested: list[AccountRef],
        counts: dict[int, tuple[int, int]],
    ) -> PullRead:
        api = f"{self.base_url}/api/v1/repos/{res.full_name}"
        owner = res.repo.owner.login
        conversation, on_lines = counts.get(p.id, (0, 0))
        return PullRead(
            id=p.id,
            number=p.number,
            url=f"{api}/pulls/{p.number}",
            html_url=self.html_url(res, p.number),
            state="open" if p.state == "open" else "closed",
            title=p.title,
            body=p.body,
            user=accounts.get(p.author_id) if p.author_id else None,
            draft=p.draft,
            head=PullBranchRead(label=f"{owner}:{p.head_ref}", ref=p.head_ref, sha=p.head_sha),
            base=PullBranchRead(label=f"{owner}:{p.base_ref}", ref=p.base_ref, sha=p.base_sha),
            merged=p.state == "merged",
            merged_at=p.merged_at,
            merged_by=accounts.get(p.merged_by_id) if p.merged_by_id else None,
            merge_commit_sha=p.merge_commit_sha,
            created_at=p.created_at,
            updated_at=p.updated_at,
            closed_at=p.closed_at,
            requested_reviewers=requested,
            comments=conversation,
            review_comments=on_lines,
        )

    async def _requested(self, pulls: list[PullRequest]) -> dict[int, list[int]]:
        if not pulls:
            return {}
        rows = await self.session.execute(
            select(PullReviewRequest.pull_id, PullReviewRequest.account_id)
            .where(PullReviewRequest.pull_id.in_([p.id for p in pulls]))
            .order_by(PullReviewRequest.id)
        )
        found: dict[int, list[int]] = {}
        for pull_id, account_id in rows.all():
            found.setdefault(pull_id, []).append(account_id)
        return found

    async def _comment_counts(self, pulls: list[PullRequest]) -> dict[int, tuple[int, int]]:
        """pull id -> (conversation comments, line comments)."""
        if not pulls:
            return {}
        rows = await self.session.execute(
            select(PullComment.pull_id, PullComment.path.is_(None), func.count())
            .outerjoin(PullReview, PullReview.id == PullComment.review_id)
            .where(
                PullComment.pull_id.in_([p.id for p in pulls]),
                or_(PullReview.id.is_(None), PullReview.verdict != "pending"),  # drafts are their author's
            )
            .group_by(PullComment.pull_id, PullComment.path.is_(None))
        )
        found: dict[int, tuple[int, int]] = {}
        for pull_id, conversation, n in rows.all():
            c, lines = found.get(pull_id, (0, 0))
            found[pull_id] = (c + int(n), lines) if conversation else (c, lines + int(n))
        return found

    # -- changing --------------------------------------------------------------------------

    async def open(self, actor: Actor, res: RepoResource, data: PullCreate) -> PullRequest:
        """Open a pull request of `data.head` into `data.base`; 409 `pull_request_exists` when
        one is open for the same pair, 422 when a branch is missing or adds nothing."""
        require(actor.principal, Action.PULL_WRITE, res)
        head, base = await self._head(actor, res, data.head), _base(data.base)
        if head == base:
            raise InvalidInput(
                "head and base are the same branch: open a pull request from the branch with the changes",
                code=Code.INVALID_PULL_BRANCHES,
            )
        tips = await self._tips(res, base, head)
        if tips.ahead_by == 0:
            raise InvalidInput(
                f"{head} has no commit that {base} lacks: push the changes first", code=Code.NO_COMMITS_BETWEEN
            )
        await self._refuse_duplicate(res, head, base)
        pull = PullRequest(
            repo_id=res.repo.id,
            number=await allocate_number(self.session, res.repo.id),
            title=one_line(data.title) or head,
            body=data.body,
            head_ref=head,
            base_ref=base,
            head_sha=tips.head_sha or "",
            base_sha=tips.base_sha or "",
            state="open",
            draft=data.draft,
            author_id=actor.principal.account_id,
            head_pushed_by_id=actor.principal.account_id,
        )
        try:
            async with self.session.begin_nested():
                self.session.add(pull)
                await self.session.flush()
        except IntegrityError:  # a concurrent open of the same pair won
            await self._refuse_duplicate(res, head, base)
            raise
        audit.record(self.session, actor, "repo.pull.open", f"{res.full_name}#{pull.number}", head=head, base=base)
        await self.announce_opened(actor, res, pull)
        return pull

    async def _head(self, actor: Actor, res: RepoResource, given: str) -> str:
        """The head branch, by name or as GitHub clients write it, `owner:branch`. The owner of
        this repository names its own branch; another owner names a branch of their repository of
        the same name: 404 as for a missing repository when the opener cannot read it, else 422
        (pull requests go between branches of one repository)."""
        owner, colon, branch = given.strip().partition(":")
        if not colon or not owner:  # git forbids `:` in branch names: no prefix, or not a name at all
            return _branch(given, "head")
        if owner.lower() == res.repo.owner.login.lower():
            return _branch(branch, "head")
        other = await load(self.session, actor.principal, owner, res.repo.name)
        raise InvalidInput(
            f"{owner}:{branch.strip()[:80]} is a branch of {other.full_name}: cross-repository pull requests are "
            f"not supported; push the branch to {res.full_name} and open the pull request from it there",
            code=Code.INVALID_PULL_BRANCHES,
            field="head",
        )

    async def _tips(self, res: RepoResource, base: str, head: str) -> Divergence:
        tips = await self.store.read(res.key, divergence, base, head)
        for name, sha, which in ((base, tips.base_sha, "base"), (head, tips.head_sha, "head")):
            if sha is None:
                raise InvalidInput(
                    f"{res.full_name} has no branch {name!r} ({which}): push it first",
                    code=Code.INVALID_PULL_BRANCHES,
                    field=which,
                )
        return tips

    async def _refuse_duplicate(self, res: RepoResource, head: str, base: str, *, but: int | None = None) -> None:
        stmt = select(PullRequest.number).where(
            PullRequest.repo_id == res.repo.id,
            PullRequest.head_ref == head,
            PullRequest.base_ref == base,
            PullRequest.state == "open",
        )
        if but is not None:
            stmt = stmt.where(PullRequest.id != but)
        number = (await self.session.execute(stmt)).scalar()
        if number is not None:
            raise InvalidState(
                f"pull request #{number} already proposes {head} into {base}: continue there",
                code=Code.PULL_REQUEST_EXISTS,
                number=number,
                html_url=self.html_url(res, number),
            )

    async def edit(self, actor: Actor, res: RepoResource, number: int, data: PullUpdate) -> PullRequest:
        """Change the title, description, draft flag or base, close or reopen."""
        require(actor.principal, Action.PULL_WRITE, res)
        pull = await self.get(res, number, lock=True)
        if task_branch(pull.head_ref):
            raise InvalidState(
                f"#{pull.number} holds a task's work: it follows its task (close the task to close it)",
                code=Code.TASK_PULL_REQUEST,
            )
        changed: dict[str, object] = {}
        if data.state is not None and data.state != ("open" if pull.state == "open" else "closed"):
            await self._set_state(actor, res, pull, data.state)
            changed["state"] = data.state
        if data.title is not None and one_line(data.title) != pull.title:
            pull.title = changed["title"] = one_line(data.title) or pull.title
        if data.body is not None and data.body != pull.body:
            pull.body = data.body
            changed["body"] = True
        if data.draft is not None and data.draft != pull.draft:
            self._require_open(pull)
            pull.draft = changed["draft"] = data.draft
        if data.base is not None and _base(data.base) != pull.base_ref:
            await self._rebase(res, pull, _base(data.base))
            changed["base"] = pull.base_ref
            changed["dismissed_reviews"] = await self.dismiss_stale(res, pull, every=True)
        if changed:
            pull.updated_at = utcnow()
            audit.record(self.session, actor, "repo.pull.edit", f"{res.full_name}#{pull.number}", **changed)
        return pull

    async def _rebase(self, res: RepoResource, pull: PullRequest, base: str) -> None:
        """Point an open pull request at another base branch."""
        self._require_open(pull)
        if base == pull.head_ref:
            raise InvalidInput("the base cannot be the head branch itself", code=Code.INVALID_PULL_BRANCHES)
        tips = await self._tips(res, base, pull.head_ref)
        await self._refuse_duplicate(res, pull.head_ref, base, but=pull.id)
        pull.base_ref, pull.base_sha = base, tips.base_sha or ""

    async def _set_state(self, actor: Actor, res: RepoResource, pull: PullRequest, state: str) -> None:
        if pull.state == "merged":
            raise InvalidState(f"#{pull.number} is merged: it cannot be reopened or closed", code=Code.PULL_NOT_OPEN)
        if state == "closed":
            pull.state, pull.closed_at = "closed", utcnow()
            await self.publish(actor, res, pull, "closed")
            return
        tips = await self._tips(res, pull.base_ref, pull.head_ref)
        await self._refuse_duplicate(res, pull.head_ref, pull.base_ref, but=pull.id)
        pull.state, pull.closed_at, pull.head_sha = "open", None, tips.head_sha or ""
        await self.publish(actor, res, pull, "reopened")

    @staticmethod
    def _require_open(pull: PullRequest) -> None:
        if pull.state != "open":
            raise InvalidState(f"#{pull.number} is {pull.state}: reopen it first", code=Code.PULL_NOT_OPEN)
