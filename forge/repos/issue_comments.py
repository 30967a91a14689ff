"""Comments on issues: write, edit (the text each edit replaced is kept: the edit history), delete
(by the author or a repository admin), and the timeline that interleaves them with the issue's
events (docs/issues.md). Each change is audited and published (`comment.*`)."""

from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from forge.core.access import Action, Principal, can, require
from forge.core.error_codes import Code
from forge.core.errors import Forbidden, NotFound
from forge.db import audit
from forge.db.audit import Actor
from forge.db.engine import utcnow
from forge.db.events import PAYLOADS, AccountRef, Event
from forge.db.issue_models import Issue, IssueComment, IssueEdit, IssueEvent
from forge.db.issue_payloads import CommentPayload, CommentTarget
from forge.repos import issue_agents
from forge.repos.issue_base import IssueBase
from forge.repos.issue_refs import IssueRefs, Source
from forge.repos.issue_shapes import CommentRead, EditRead, TimelineRead
from forge.repos.repositories import RepoResource

MAX_TIMELINE = 2_000
# Timeline entries about tasks (forge.repos.issue_agents, tasks.services.agent_triggers).
TASK_EVENTS = ("task", "task_state", "trigger_refused")


@dataclass
class IssueComments(IssueBase):
    """The issue comments of the request's transaction."""

    def comment_url(self, res: RepoResource, number: int, comment_id: int) -> str:
        return f"{self.html_url(res, number)}#issuecomment-{comment_id}"

    async def find(self, res: RepoResource, comment_id: int) -> tuple[IssueComment, Issue]:
        row = (
            await self.session.execute(
                select(IssueComment, Issue)
                .join(Issue, Issue.id == IssueComment.issue_id)
                .where(IssueComment.id == comment_id, Issue.repo_id == res.repo.id)
            )
        ).one_or_none()
        if row is None:
            raise NotFound(f"{res.full_name} has no issue comment {comment_id}", code=Code.COMMENT_NOT_FOUND)
        return row[0], row[1]

    async def all(self, res: RepoResource, issue: Issue) -> list[CommentRead]:
        stmt = select(IssueComment).where(IssueComment.issue_id == issue.id).order_by(IssueComment.id)
        return await self.reads(res, issue, list((await self.session.execute(stmt)).scalars()))

    async def reads(self, res: RepoResource, issue: Issue, comments: list[IssueComment]) -> list[CommentRead]:
        people = await self.accounts({c.author_id for c in comments if c.author_id is not None})
        edits = await _edit_counts(self.session, [c.id for c in comments])
        return [
            CommentRead(
                id=c.id,
                body=c.body,
                user=people.get(c.author_id) if c.author_id else None,
                html_url=self.comment_url(res, issue.number, c.id),
                issue_url=self.html_url(res, issue.number),
                created_at=c.created_at,
                updated_at=c.updated_at,
                edits=edits.get(c.id, 0),
            )
            for c in comments
        ]

    # -- changing --------------------------------------------------------------------------

    async def create(self, actor: Actor, res: RepoResource, issue: Issue, body: str) -> IssueComment:
        require(actor.principal, Action.ISSUE_WRITE, res)
        comment = IssueComment(issue_id=issue.id, author_id=actor.principal.account_id, body=body)
        self.session.add(comment)
        issue.updated_at = utcnow()
        await self.session.flush()
        audit.record(self.session, actor, "repo.issue.comment", f"{res.full_name}#{issue.number}", comment=comment.id)
        await self.publish_comment(actor, res, issue, comment, "created")
        source = Source("issue", issue.number, issue.title, comment.id)
        await IssueRefs(self.session, self.bus, self.base_url).cross_reference(actor, res, source, body)
        await issue_agents.commented_on_issue(self.session, self.agents, actor, res, issue, comment, self.record)
        return comment

    async def edit(self, actor: Actor, res: RepoResource, comment_id: int, body: str) -> IssueComment:
        comment, issue = await self.find(res, comment_id)
        self._may_change(actor, res, comment, admin_too=False)
        if body == comment.body:
            return comment
        before = comment.body
        editor = actor.principal.account_id
        self.session.add(IssueEdit(issue_id=issue.id, comment_id=comment.id, body_before=before, editor_id=editor))
        comment.body, comment.updated_at = body, utcnow()
        audit.record(
            self.session, actor, "repo.issue.comment.edit", f"{res.full_name}#{issue.number}", comment=comment.id
        )
        await self.publish_comment(actor, res, issue, comment, "edited", body_before=before)
        return comment

    async def delete(self, actor: Actor, res: RepoResource, comment_id: int) -> None:
        comment, issue = await self.find(res, comment_id)
        self._may_change(actor, res, comment, admin_too=True)
        await self.publish_comment(actor, res, issue, comment, "deleted")
        audit.record(
            self.session, actor, "repo.issue.comment.delete", f"{res.full_name}#{issue.number}",
            comment=comment.id, author_id=comment.author_id, chars=len(comment.body),
        )  # fmt: skip
        await self.session.delete(comment)

    def _may_change(self, actor: Actor, res: RepoResource, comment: IssueComment, *, admin_too: bool) -> None:
        """A comment is changed by its author; deleted by its author or a repository admin."""
        require(actor.principal, Action.ISSUE_WRITE, res)
        mine = comment.author_id is not None and comment.author_id == actor.principal.account_id
        if mine or (admin_too and can(actor.principal, Action.REPO_ADMIN, res)):
            return
        who = "its author or a repository admin" if admin_too else "its author"
        raise Forbidden(f"only {who} may change comment {comment.id}", code=Code.NOT_YOUR_COMMENT)

    async def edits(self, res: RepoResource, comment_id: int) -> list[EditRead]:
        comment, _ = await self.find(res, comment_id)
        rows = list(
            (
                await self.session.execute(
                    select(IssueEdit).where(IssueEdit.comment_id == comment.id).order_by(IssueEdit.id.desc())
                )
            ).scalars()
        )
        return await self.edit_reads(rows)

    async def issue_edits(self, issue: Issue) -> list[EditRead]:
        stmt = (
            select(IssueEdit)
            .where(IssueEdit.issue_id == issue.id, IssueEdit.comment_id.is_(None))
            .order_by(IssueEdit.id.desc())
        )
        return await self.edit_reads(list((await self.session.execute(stmt)).scalars()))

    async def edit_reads(self, rows: list[IssueEdit]) -> list[EditRead]:
        people = await self.accounts({r.editor_id for r in rows if r.editor_id is not None})
        return [
            EditRead(
                editor=people.get(r.editor_id) if r.editor_id else None,
                created_at=r.created_at,
                title_before=r.title_before,
                body_before=r.body_before,
            )
            for r in rows
        ]

    async def publish_comment(
        self, actor: Actor | None, res: RepoResource, issue: Issue, comment: IssueComment, what: str, **extra: object
    ) -> None:
        author = (await self.accounts({comment.author_id})).get(comment.author_id) if comment.author_id else None
        payload_type = PAYLOADS[f"comment.{what}"]  # type: ignore[index]
        assert issubclass(payload_type, CommentPayload)
        payload = payload_type(
            id=comment.id,
            body=comment.body,
            html_url=self.comment_url(res, issue.number, comment.id),
            author=author,
            issue=CommentTarget(number=issue.number, title=issue.title, html_url=self.html_url(res, issue.number)),
            **extra,
        )
        await self.bus.publish(
            self.session,
            Event(
                repo_id=res.repo.id,
                repo_uuid=res.repo.uuid,
                repository=res.full_name,
                actor=AccountRef.of(actor.principal) if actor is not None else None,
                data=payload,  # type: ignore[arg-type]  # one of the comment.* payloads, by name
            ),
        )

    # -- the timeline ----------------------------------------------------------------------

    async def timeline(self, res: RepoResource, issue: Issue, viewer: Principal) -> list[TimelineRead]:
        """Comments and events, oldest first (at most the first 2,000 of each). The tasks an issue
        started (their numbers, states, questions, refusals) are shown to those who may see tasks
        only (the write role): below it, tasks do not exist for the viewer."""
        by_comment = select(IssueComment).where(IssueComment.issue_id == issue.id).order_by(IssueComment.id)
        comment_rows = (await self.session.execute(by_comment.limit(MAX_TIMELINE))).scalars()
        comments = await self.reads(res, issue, list(comment_rows))
        by_event = select(IssueEvent).where(IssueEvent.issue_id == issue.id).order_by(IssueEvent.id)
        if not can(viewer, Action.TASK_READ, res):
            by_event = by_event.where(IssueEvent.event.not_in(TASK_EVENTS))
        events = list((await self.session.execute(by_event.limit(MAX_TIMELINE))).scalars())
        people = await self.accounts({e.actor_id for e in events if e.actor_id is not None})
        entries = [
            TimelineRead(id=f"comment-{c.id}", event="commented", actor=c.user, created_at=c.created_at, comment=c)
            for c in comments
        ] + [
            TimelineRead(
                id=f"event-{e.id}",
                event=e.event,
                actor=people.get(e.actor_id) if e.actor_id else None,
                created_at=e.created_at,
                details=dict(e.data or {}),
            )
            for e in events
        ]
        return sorted(entries, key=lambda t: t.created_at)


async def _edit_counts(session: AsyncSession, ids: list[int]) -> dict[int, int]:
    if not ids:
        return {}
    rows = await session.execute(
        select(IssueEdit.comment_id, func.count()).where(IssueEdit.comment_id.in_(ids)).group_by(IssueEdit.comment_id)
    )
    return {int(cid): int(n) for cid, n in rows.all()}
