"""Issues: open, read, list (with filters), edit, close with a reason, reopen; labels, assignees
and the milestone (docs/issues.md).

Numbers come from the sequence issues share with pull requests. Anyone who can read the repository
may open an issue and comment; the author may edit and close their own issue; labels, assignees,
milestones and closing someone else's issue need the write role (`issue.triage`). Each change is
audited (`repo.issue.*`), recorded on the issue's timeline and published (`issue.*`) in its
transaction. Comments are `forge.repos.issue_comments`; `#N` references and `Fixes #N`,
`forge.repos.issue_refs`."""

from dataclasses import dataclass, field
from typing import Any, Literal

from msgspec import UNSET
from sqlalchemy import func, or_, select

from forge.core.access import Action, can, require
from forge.core.error_codes import Code
from forge.core.errors import InvalidInput
from forge.core.text import one_line
from forge.db import audit
from forge.db.audit import Actor
from forge.db.engine import utcnow
from forge.db.issue_models import Issue, IssueAssignee, IssueComment, IssueEdit, IssueLabel, Label, Milestone
from forge.db.issue_payloads import IssueChanges
from forge.db.models import Account, PullRequest
from forge.git import RepoStore
from forge.git.history import messages_between
from forge.repos.issue_refs import IssueRefs, Source
from forge.repos.issue_shapes import IssueCreate, IssueRead, IssueUpdate
from forge.repos.issue_triage import IssueTriage
from forge.repos.labels import Labels
from forge.repos.numbers import allocate_number
from forge.repos.repositories import RepoResource

PAGE_SIZE = 30
Sort = Literal["created", "updated", "comments"]


@dataclass(frozen=True)
class IssueFilter:
    """What the issue list shows (GitHub's query parameters)."""

    state: Literal["open", "closed", "all"] = "open"
    labels: tuple[str, ...] = ()
    assignee: str | None = None  # a login, or "none"
    author: str | None = None
    milestone: int | None = None
    q: str = ""  # words that must all appear in the title or the body
    sort: Sort = "created"
    direction: Literal["asc", "desc"] = "desc"
    page: int = 1
    per_page: int = field(default=PAGE_SIZE)


@dataclass
class Issues(IssueTriage):
    """The issues of the request's transaction."""

    # -- reading ---------------------------------------------------------------------------

    async def page(self, res: RepoResource, f: IssueFilter) -> list[Issue]:
        stmt = select(Issue).where(Issue.repo_id == res.repo.id)
        if f.state != "all":
            stmt = stmt.where(Issue.state == f.state)
        for name in f.labels:
            stmt = stmt.where(
                Issue.id.in_(
                    select(IssueLabel.issue_id)
                    .join(Label, Label.id == IssueLabel.label_id)
                    .where(Label.name_key == name.strip().casefold(), Label.repo_id == res.repo.id)
                )
            )
        stmt = self._people_filters(stmt, f)
        if f.milestone is not None:
            stmt = stmt.where(
                Issue.milestone_id.in_(
                    select(Milestone.id).where(Milestone.repo_id == res.repo.id, Milestone.number == f.milestone)
                )
            )
        for word in f.q.split()[:10]:
            pattern = "%" + word.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
            stmt = stmt.where(or_(Issue.title.ilike(pattern, escape="\\"), Issue.body.ilike(pattern, escape="\\")))
        return list((await self.session.execute(self._ordered(stmt, f))).scalars())

    def _people_filters(self, stmt, f: IssueFilter):  # type: ignore[no-untyped-def]
        if f.author:
            stmt = stmt.where(
                Issue.author_id.in_(select(Account.id).where(Account.login_key == f.author.strip().lower()))
            )
        if f.assignee == "none":
            stmt = stmt.where(~Issue.id.in_(select(IssueAssignee.issue_id)))
        elif f.assignee:
            stmt = stmt.where(
                Issue.id.in_(
                    select(IssueAssignee.issue_id)
                    .join(Account, Account.id == IssueAssignee.account_id)
                    .where(Account.login_key == f.assignee.strip().lower())
                )
            )
        return stmt

    def _ordered(self, stmt, f: IssueFilter):  # type: ignore[no-untyped-def]
        key: Any
        if f.sort == "comments":
            key = select(func.count()).where(IssueComment.issue_id == Issue.id).scalar_subquery()
        else:
            key = Issue.updated_at if f.sort == "updated" else Issue.created_at
        order = [key.asc() if f.direction == "asc" else key.desc(), Issue.number.desc()]
        return stmt.order_by(*order).offset((f.page - 1) * f.per_page).limit(f.per_page)

    async def counts(self, res: RepoResource) -> dict[str, int]:
        rows = await self.session.execute(
            select(Issue.state, func.count()).where(Issue.repo_id == res.repo.id).group_by(Issue.state)
        )
        found = {state: int(n) for state, n in rows.all()}
        return {s: found.get(s, 0) for s in ("open", "closed")}

    async def reads(self, res: RepoResource, issues: list[Issue]) -> list[IssueRead]:
        ids = [i.id for i in issues]
        labels = await self.labels_of(ids)
        assigned = await self.assignee_ids(ids)
        people = await self.accounts(
            {a for i in issues for a in (i.author_id, i.closed_by_id) if a is not None}
            | {a for found in assigned.values() for a in found}
        )
        milestone_ids = {i.milestone_id for i in issues if i.milestone_id}
        milestones = {}
        if milestone_ids:
            stmt = select(Milestone).where(Milestone.id.in_(milestone_ids))
            found = list((await self.session.execute(stmt)).scalars())
            reads = await Labels(self.session, self.base_url).milestone_reads(res, found)
            milestones = {m.id: r for m, r in zip(found, reads, strict=True)}
        comments = await self._comment_counts(ids)
        labels_api = Labels(self.session, self.base_url)
        return [
            IssueRead(
                id=i.id,
                number=i.number,
                title=i.title,
                body=i.body,
                state=i.state,  # type: ignore[arg-type]
                state_reason=i.state_reason,  # type: ignore[arg-type]
                user=people.get(i.author_id) if i.author_id else None,
                labels=[labels_api.read(res, label) for label in labels[i.id]],
                assignees=[people[a] for a in assigned[i.id] if a in people],
                milestone=milestones.get(i.milestone_id) if i.milestone_id else None,
                comments=comments.get(i.id, 0),
                html_url=self.html_url(res, i.number),
                created_at=i.created_at,
                updated_at=i.updated_at,
                closed_at=i.closed_at,
                closed_by=people.get(i.closed_by_id) if i.closed_by_id else None,
                author_association=self._association(res, i),
            )
            for i in issues
        ]

    async def read(self, res: RepoResource, issue: Issue) -> IssueRead:
        return (await self.reads(res, [issue]))[0]

    @staticmethod
    def _association(res: RepoResource, issue: Issue) -> Literal["OWNER", "COLLABORATOR", "CONTRIBUTOR", "NONE"]:
        if issue.author_id is not None and issue.author_id == res.repo.owner_id:
            return "OWNER"
        return "NONE" if issue.author_untrusted else "COLLABORATOR"

    async def _comment_counts(self, ids: list[int]) -> dict[int, int]:
        if not ids:
            return {}
        rows = await self.session.execute(
            select(IssueComment.issue_id, func.count())
            .where(IssueComment.issue_id.in_(ids))
            .group_by(IssueComment.issue_id)
        )
        return {issue_id: int(n) for issue_id, n in rows.all()}

    # -- changing --------------------------------------------------------------------------

    async def open(self, actor: Actor, res: RepoResource, data: IssueCreate) -> Issue:
        require(actor.principal, Action.ISSUE_WRITE, res)
        issue = Issue(
            repo_id=res.repo.id,
            number=await allocate_number(self.session, res.repo.id),
            title=self._title(data.title),
            body=data.body,
            author_id=actor.principal.account_id,
            author_untrusted=not can(actor.principal, Action.REPO_WRITE, res),
        )
        self.session.add(issue)
        await self.session.flush()
        if can(actor.principal, Action.ISSUE_TRIAGE, res):  # GitHub ignores them from anyone else
            await self._set_labels(actor, res, issue, data.labels, publish=False)
            await self._set_assignees(actor, res, issue, data.assignees, publish=False)
            if data.milestone is not None:
                await self._set_milestone(actor, res, issue, data.milestone)
        audit.record(self.session, actor, "repo.issue.open", f"{res.full_name}#{issue.number}")
        await self.publish(actor, res, issue, "opened")
        await self.cross_reference(actor, res, Source("issue", issue.number, issue.title), issue.body)
        return issue

    async def update(self, actor: Actor, res: RepoResource, number: int, data: IssueUpdate) -> Issue:
        issue = await self.get(res, number, lock=True)
        self._may_edit(actor, res, issue)
        triage = data.labels is not None or data.assignees is not None or data.milestone is not UNSET
        if triage:
            require(actor.principal, Action.ISSUE_TRIAGE, res)
        await self._edit_text(actor, res, issue, data)
        if data.labels is not None:
            await self._set_labels(actor, res, issue, data.labels)
        if data.assignees is not None:
            await self._set_assignees(actor, res, issue, data.assignees)
        if data.milestone is not UNSET:
            await self._set_milestone(actor, res, issue, data.milestone or 0)
        if data.state == "closed" or (data.state is None and data.state_reason and issue.state == "closed"):
            await self.close(actor, res, issue, data.state_reason or "completed")
        elif data.state == "open":
            await self.reopen(actor, res, issue)
        issue.updated_at = utcnow()
        return issue

    def _may_edit(self, actor: Actor, res: RepoResource, issue: Issue) -> None:
        """The author edits and closes their own issue; anyone else needs the write role."""
        require(actor.principal, Action.ISSUE_WRITE, res)
        if issue.author_id is None or issue.author_id != actor.principal.account_id:
            require(actor.principal, Action.ISSUE_TRIAGE, res)

    async def _edit_text(self, actor: Actor, res: RepoResource, issue: Issue, data: IssueUpdate) -> None:
        title = self._title(data.title) if data.title is not None else issue.title
        body = data.body if data.body is not None else issue.body
        if title == issue.title and body == issue.body:
            return
        changes = IssueChanges(
            title=issue.title if title != issue.title else UNSET,
            body=issue.body if body != issue.body else UNSET,
        )
        self.session.add(
            IssueEdit(
                issue_id=issue.id,
                title_before=issue.title if title != issue.title else None,
                body_before=issue.body if body != issue.body else None,
                editor_id=actor.principal.account_id,
            )
        )
        if title != issue.title:
            self.record(issue, actor, "renamed", **{"from": issue.title, "to": title})
        issue.title, issue.body = title, body
        await self.cross_reference(actor, res, Source("issue", issue.number, issue.title), body)
        audit.record(self.session, actor, "repo.issue.edit", f"{res.full_name}#{issue.number}")
        await self.publish(actor, res, issue, "edited", changes=changes)

    async def close(
        self, actor: Actor, res: RepoResource, issue: Issue, reason: str, *, by_pull: int | None = None
    ) -> bool:
        """Close an open issue with its reason; False when it was closed already."""
        if issue.state == "closed":
            if issue.state_reason != reason and by_pull is None:
                issue.state_reason = reason
            return False
        now = utcnow()
        issue.state, issue.state_reason, issue.closed_at = "closed", reason, now
        issue.closed_by_id = actor.principal.account_id
        self.record(issue, actor, "closed", state_reason=reason, **({"pull_request": by_pull} if by_pull else {}))
        audit.record(self.session, actor, "repo.issue.close", f"{res.full_name}#{issue.number}", reason=reason)
        await self.publish(actor, res, issue, "closed", closed_by_pull_request=by_pull)
        return True

    async def reopen(self, actor: Actor, res: RepoResource, issue: Issue) -> None:
        if issue.state == "open":
            return
        issue.state, issue.state_reason, issue.closed_at, issue.closed_by_id = "open", "reopened", None, None
        self.record(issue, actor, "reopened")
        audit.record(self.session, actor, "repo.issue.reopen", f"{res.full_name}#{issue.number}")
        await self.publish(actor, res, issue, "reopened")

    async def close_fixed(
        self, store: RepoStore, actor: Actor, res: RepoResource, pull: PullRequest, base_before: str
    ) -> list[int]:
        """A pull request merged: close the issues its description or merged commits say it fixes.
        An agent's pull request closes what its description says only: its commits' messages are
        the agent's words (and forge writes its `Fixes #N` into the description)."""
        author = await self.session.get(Account, pull.author_id) if pull.author_id else None
        by_agent = author is not None and author.is_bot
        read = pull.head_sha and not by_agent
        messages = await store.read(res.key, messages_between, base_before, pull.head_sha) if read else []
        refs = IssueRefs(self.session, self.bus, self.base_url)
        closed = []
        for issue in await refs.issues_closed_by(res, [pull.body, *messages]):
            if await self.close(actor, res, issue, "completed", by_pull=pull.number):
                closed.append(issue.number)
        return closed

    async def cross_reference(self, actor: Actor, res: RepoResource, source: Source, text: str) -> None:
        await IssueRefs(self.session, self.bus, self.base_url).cross_reference(actor, res, source, text)

    @staticmethod
    def _title(raw: str) -> str:
        title = one_line(raw)
        if not title:
            raise InvalidInput("an issue needs a title", code=Code.VALIDATION_FAILED, field="title")
        return title
