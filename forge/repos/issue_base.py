"""What every change of an issue shares: who the accounts are, the issue's address, its timeline
entries and its `issue.*` events. `Issues` (forge/repos/issues.py) and `IssueComments`
(forge/repos/issue_comments.py) build on it."""

from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from forge.core.error_codes import Code
from forge.core.errors import NotFound
from forge.db.audit import Actor
from forge.db.events import PAYLOADS, AccountRef, Event, EventBus
from forge.db.issue_models import Issue, IssueAssignee, IssueEvent, IssueLabel, Label, Milestone
from forge.db.issue_payloads import IssuePayload, LabelRef
from forge.db.models import Account
from forge.repos.issue_agents import AgentWork
from forge.repos.repositories import RepoResource


def parse_number(raw: str) -> int:
    """Issue numbers are positive integers written plainly; anything else is 404."""
    if not raw.isascii() or not raw.isdigit() or len(raw) > 9 or int(raw) < 1:
        raise NotFound("no such issue", code=Code.ISSUE_NOT_FOUND)
    return int(raw)


@dataclass
class IssueBase:
    """The issues of one transaction: its session, the event bus and the instance's base URL."""

    session: AsyncSession
    bus: EventBus
    base_url: str
    # The tasks side, when the app was composed with it: bots assigned or mentioned start work.
    agents: AgentWork | None = None

    def html_url(self, res: RepoResource, number: int) -> str:
        return f"{self.base_url}/{res.full_name}/issues/{number}"

    async def get(self, res: RepoResource, number: int, *, lock: bool = False) -> Issue:
        stmt = select(Issue).where(Issue.repo_id == res.repo.id, Issue.number == number)
        if lock:
            stmt = stmt.with_for_update()
        issue = (await self.session.execute(stmt)).scalar_one_or_none()
        if issue is None:
            raise NotFound(f"{res.full_name} has no issue #{number}", code=Code.ISSUE_NOT_FOUND)
        return issue

    async def accounts(self, ids: set[int]) -> dict[int, AccountRef]:
        if not ids:
            return {}
        rows = await self.session.execute(select(Account).where(Account.id.in_(ids)))
        return {a.id: AccountRef(login=a.login, type="Bot" if a.is_bot else "User") for a in rows.scalars()}

    async def labels_of(self, issue_ids: list[int]) -> dict[int, list[Label]]:
        found: dict[int, list[Label]] = {i: [] for i in issue_ids}
        if not issue_ids:
            return found
        rows = await self.session.execute(
            select(IssueLabel.issue_id, Label)
            .join(Label, Label.id == IssueLabel.label_id)
            .where(IssueLabel.issue_id.in_(issue_ids))
            .order_by(Label.name_key)
        )
        for issue_id, label in rows.all():
            found[issue_id].append(label)
        return found

    async def assignee_ids(self, issue_ids: list[int]) -> dict[int, list[int]]:
        found: dict[int, list[int]] = {i: [] for i in issue_ids}
        if not issue_ids:
            return found
        rows = await self.session.execute(
            select(IssueAssignee.issue_id, IssueAssignee.account_id)
            .where(IssueAssignee.issue_id.in_(issue_ids))
            .order_by(IssueAssignee.created_at, IssueAssignee.account_id)
        )
        for issue_id, account_id in rows.all():
            found[issue_id].append(account_id)
        return found

    def record(self, issue: Issue, actor: Actor | None, event: str, **data: Any) -> None:
        """One timeline entry (labeled, assigned, closed, cross-referenced, ...)."""
        self.session.add(
            IssueEvent(
                issue_id=issue.id,
                actor_id=actor.principal.account_id if actor is not None else None,
                event=event,
                data=data,
            )
        )

    async def publish(self, actor: Actor | None, res: RepoResource, issue: Issue, what: str, **extra: object) -> None:
        """`issue.<what>` for this issue, in the change's transaction."""
        await self.session.flush()
        labels = (await self.labels_of([issue.id]))[issue.id]
        assigned = (await self.assignee_ids([issue.id]))[issue.id]
        people = await self.accounts({*assigned, *([issue.author_id] if issue.author_id else [])})
        milestone = await self.session.get(Milestone, issue.milestone_id) if issue.milestone_id else None
        payload_type = PAYLOADS[f"issue.{what}"]  # type: ignore[index]
        assert issubclass(payload_type, IssuePayload)
        payload = payload_type(
            number=issue.number,
            title=issue.title,
            body=issue.body,
            html_url=self.html_url(res, issue.number),
            state=issue.state,  # type: ignore[arg-type]
            state_reason=issue.state_reason,  # type: ignore[arg-type]
            author=people.get(issue.author_id) if issue.author_id else None,
            labels=[LabelRef(name=label.name, color=label.color) for label in labels],
            assignees=[people[i] for i in assigned if i in people],
            milestone=milestone.title if milestone else None,
            **extra,
        )
        await self.bus.publish(
            self.session,
            Event(
                repo_id=res.repo.id,
                repo_uuid=res.repo.uuid,
                repository=res.full_name,
                actor=AccountRef.of(actor.principal) if actor is not None else None,
                data=payload,  # type: ignore[arg-type]  # one of the issue.* payloads, by name
            ),
        )
