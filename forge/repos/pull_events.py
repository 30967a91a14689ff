"""What every change of a pull request shares: its `pull_request.*` events, what a push to its head
does (`after_push`: the head recorded, approvals of other heads dismissed under the rule, who moved
it remembered, `pull_request.synchronized`), a review published (`pull_request.review_submitted`, a
task's review included), and its ending elsewhere (merged by its task's merge, closed with its
task). `Pulls` (forge/repos/pulls.py) builds on it."""

from dataclasses import dataclass

from sqlalchemy import delete, select, true, update
from sqlalchemy.ext.asyncio import AsyncSession

from forge.db import audit
from forge.db.audit import Actor
from forge.db.engine import utcnow
from forge.db.events import PAYLOADS, AccountRef, Event, EventBus, PullBranch, PullRequestPayload
from forge.db.models import Account, PullRequest, PullReview, PullReviewRequest
from forge.git import RefUpdate, RepoStore
from forge.repos import merge_rules
from forge.repos.issue_agents import AgentWork
from forge.repos.issue_refs import Source
from forge.repos.issues import Issues
from forge.repos.repositories import RepoResource


@dataclass
class PullBase:
    """The pull requests of one transaction: its session, the git store, the event bus, the base URL."""

    session: AsyncSession
    store: RepoStore
    bus: EventBus
    base_url: str
    # The tasks side, when the app was composed with it: a bot mentioned in a comment starts work.
    agents: AgentWork | None = None

    def html_url(self, res: RepoResource, number: int) -> str:
        return f"{self.base_url}/{res.full_name}/pull/{number}"

    async def accounts(self, ids: set[int]) -> dict[int, AccountRef]:
        if not ids:
            return {}
        rows = await self.session.execute(select(Account).where(Account.id.in_(ids)))
        return {a.id: AccountRef(login=a.login, type="Bot" if a.is_bot else "User") for a in rows.scalars()}

    # -- reviewed (here or through its task), merged elsewhere, closed with their task --------

    async def record_review(
        self, actor: Actor, res: RepoResource, pull: PullRequest, review_id: int, verdict: str, comments: int
    ) -> None:
        """A review published (its own, or its task's): the reviewer's request answered,
        `pull_request.review_submitted`. The audit row is the caller's (`repo.pull.review`, `task.review`)."""
        await self.session.execute(
            delete(PullReviewRequest).where(
                PullReviewRequest.pull_id == pull.id, PullReviewRequest.account_id == actor.principal.account_id
            )
        )
        pull.updated_at = utcnow()
        await self.publish(
            actor, res, pull, "review_submitted", review_id=review_id, verdict=verdict, comments=comments
        )

    async def record_merged(
        self, actor: Actor, res: RepoResource, pull: PullRequest, how: str, merged_sha: str, base_before: str
    ) -> PullRequest:
        """The pull request merged (by its merge, or by its task's): state, audit, `pull_request.merged`."""
        now = utcnow()
        pull.state, pull.merged_at, pull.closed_at, pull.updated_at = "merged", now, now, now
        pull.merged_by_id = actor.principal.account_id
        pull.merge_commit_sha, pull.base_sha = merged_sha, base_before
        audit.record(
            self.session,
            actor,
            "repo.pull.merge",
            f"{res.full_name}#{pull.number}",
            strategy=how,
            head_sha=pull.head_sha,
            merged_sha=merged_sha,
        )
        await self.publish(actor, res, pull, "merged", strategy=how, merge_commit_sha=merged_sha)
        await Issues(self.session, self.bus, self.base_url).close_fixed(self.store, actor, res, pull, base_before)
        return pull

    async def close_quietly(self, actor: Actor, res: RepoResource, pull: PullRequest) -> None:
        """Close an open pull request (its task was closed): state, audit, `pull_request.closed`."""
        if pull.state != "open":
            return
        pull.state, pull.closed_at = "closed", utcnow()
        audit.record(self.session, actor, "repo.pull.edit", f"{res.full_name}#{pull.number}", state="closed")
        await self.publish(actor, res, pull, "closed")

    # -- events ----------------------------------------------------------------------------

    async def announce_opened(self, actor: Actor, res: RepoResource, pull: PullRequest) -> None:
        """`pull_request.opened`, and the issues its description names get `cross-referenced`."""
        await self.publish(actor, res, pull, "opened")
        source = Source("pull_request", pull.number, pull.title)
        await Issues(self.session, self.bus, self.base_url).cross_reference(actor, res, source, pull.body)

    async def publish(
        self, actor: Actor | None, res: RepoResource, pull: PullRequest, what: str, **extra: object
    ) -> None:
        """`pull_request.<what>` for this pull request, in the change's transaction."""
        author = (await self.accounts({pull.author_id})).get(pull.author_id) if pull.author_id else None
        payload_type = PAYLOADS[f"pull_request.{what}"]  # type: ignore[index]
        assert issubclass(payload_type, PullRequestPayload)
        payload = payload_type(
            number=pull.number,
            title=pull.title,
            html_url=self.html_url(res, pull.number),
            state=pull.state,  # type: ignore[arg-type]
            draft=pull.draft,
            head=PullBranch(ref=pull.head_ref, sha=pull.head_sha),
            base=PullBranch(ref=pull.base_ref, sha=pull.base_sha),
            author=author,
            **extra,
        )
        await self.bus.publish(
            self.session,
            Event(
                repo_id=res.repo.id,
                repo_uuid=res.repo.uuid,
                repository=res.full_name,
                actor=AccountRef.of(actor.principal) if actor is not None else None,
                data=payload,  # type: ignore[arg-type]  # one of the pull_request.* payloads, by name
            ),
        )

    # -- pushes ----------------------------------------------------------------------------

    async def after_push(self, actor: Actor, res: RepoResource, updates: list[RefUpdate]) -> None:
        """A push moved (or deleted) branches: each open pull request whose head it moved records
        the new head, has its approvals of older heads dismissed when its base's rules say so, and
        is announced as `pull_request.synchronized`."""
        moved = {u.ref.removeprefix("refs/heads/"): u for u in updates if u.ref.startswith("refs/heads/")}
        if not moved:
            return
        pulls = (
            await self.session.execute(
                select(PullRequest).where(
                    PullRequest.repo_id == res.repo.id,
                    PullRequest.state == "open",
                    PullRequest.head_ref.in_(list(moved)),
                )
            )
        ).scalars()
        for pull in pulls:
            update_ = moved[pull.head_ref]
            before = pull.head_sha
            pull.head_sha = "" if update_.is_delete else update_.new
            if pull.head_sha == before:
                continue
            pull.head_pushed_by_id = actor.principal.account_id
            dismissed = await self.dismiss_stale(res, pull)
            pull.updated_at = utcnow()
            await self.publish(actor, res, pull, "synchronized", before=before, dismissed_reviews=dismissed)

    async def dismiss_stale(self, res: RepoResource, pull: PullRequest, *, every: bool = False) -> int:
        """Dismiss the approvals of other heads (all of them with `every`: the base changed, so
        what was approved is not what would merge)."""
        rules = await merge_rules.base_rules(self.session, res, pull.base_ref)
        if not every and not rules.dismiss_stale_approvals and pull.head_sha:
            return 0
        result = await self.session.execute(
            update(PullReview)
            .where(
                PullReview.pull_id == pull.id,
                PullReview.verdict == "approve",
                PullReview.dismissed.is_(False),
                true() if every else PullReview.commit_sha != pull.head_sha,
            )
            .values(dismissed=True)
            .execution_options(synchronize_session=False)
        )
        return int(result.rowcount or 0)  # type: ignore[attr-defined]
