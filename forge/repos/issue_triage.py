"""What sorts an issue out: its labels, assignees and milestone (the write role, `issue.triage`).
Each change is audited, put on the issue's timeline and, for a label or assignee added, published
(`issue.labeled`, `issue.assigned`). `Issues` (forge/repos/issues.py) builds on it."""

from dataclasses import dataclass

from sqlalchemy import delete, select

from forge.core.access import Action, require
from forge.core.error_codes import Code
from forge.core.errors import InvalidInput
from forge.db import audit
from forge.db.audit import Actor
from forge.db.issue_models import Issue, IssueAssignee, IssueLabel, Milestone
from forge.db.issue_payloads import LabelRef
from forge.db.models import Account
from forge.repos import issue_agents
from forge.repos.issue_base import IssueBase
from forge.repos.issue_shapes import MAX_ASSIGNEES
from forge.repos.labels import Labels
from forge.repos.repositories import RepoResource, resource_roles


@dataclass
class IssueTriage(IssueBase):
    # -- labels, assignees, milestone ------------------------------------------------------

    async def add_labels(self, actor: Actor, res: RepoResource, number: int, names: list[str]) -> Issue:
        issue = await self.get(res, number, lock=True)
        require(actor.principal, Action.ISSUE_TRIAGE, res)
        current = [label.name for label in (await self.labels_of([issue.id]))[issue.id]]
        await self._set_labels(actor, res, issue, [*current, *names])
        return issue

    async def remove_label(self, actor: Actor, res: RepoResource, number: int, name: str) -> Issue:
        issue = await self.get(res, number, lock=True)
        require(actor.principal, Action.ISSUE_TRIAGE, res)
        await Labels(self.session, self.base_url).find(res, name)
        current = [label.name for label in (await self.labels_of([issue.id]))[issue.id]]
        await self._set_labels(actor, res, issue, [n for n in current if n.casefold() != name.strip().casefold()])
        return issue

    async def _set_labels(
        self, actor: Actor, res: RepoResource, issue: Issue, names: list[str], *, publish: bool = True
    ) -> None:
        wanted = await Labels(self.session, self.base_url).resolve(res, names)
        if len(wanted) > 30:
            raise InvalidInput("an issue has at most 30 labels", code=Code.TOO_MANY_LABELS)
        current = {label.id: label for label in (await self.labels_of([issue.id]))[issue.id]}
        added = [label for label in wanted if label.id not in current]
        removed = [label for label_id, label in current.items() if label_id not in {w.id for w in wanted}]
        for label in removed:
            await self.session.execute(
                delete(IssueLabel).where(IssueLabel.issue_id == issue.id, IssueLabel.label_id == label.id)
            )
            self.record(issue, actor, "unlabeled", label=label.name, color=label.color)
        for label in added:
            self.session.add(IssueLabel(issue_id=issue.id, label_id=label.id))
            self.record(issue, actor, "labeled", label=label.name, color=label.color)
        if added or removed:
            target = f"{res.full_name}#{issue.number}"
            audit.record(
                self.session, actor, "repo.issue.labels", target,
                added=[label.name for label in added], removed=[label.name for label in removed],
            )  # fmt: skip
        for label in added if publish else []:
            await self.publish(actor, res, issue, "labeled", label=LabelRef(name=label.name, color=label.color))

    async def add_assignees(self, actor: Actor, res: RepoResource, number: int, logins: list[str]) -> Issue:
        issue = await self.get(res, number, lock=True)
        require(actor.principal, Action.ISSUE_TRIAGE, res)
        current = await self._assignee_logins(issue)
        await self._set_assignees(actor, res, issue, [*current, *logins])
        return issue

    async def remove_assignees(self, actor: Actor, res: RepoResource, number: int, logins: list[str]) -> Issue:
        issue = await self.get(res, number, lock=True)
        require(actor.principal, Action.ISSUE_TRIAGE, res)
        gone = {login.strip().lower() for login in logins}
        current = await self._assignee_logins(issue)
        await self._set_assignees(actor, res, issue, [c for c in current if c.lower() not in gone])
        return issue

    async def _assignee_logins(self, issue: Issue) -> list[str]:
        ids = (await self.assignee_ids([issue.id]))[issue.id]
        people = await self.accounts(set(ids))
        return [people[i].login for i in ids if i in people]

    async def _set_assignees(
        self, actor: Actor, res: RepoResource, issue: Issue, logins: list[str], *, publish: bool = True
    ) -> None:
        wanted = await self._assignable(res, logins)
        current = set((await self.assignee_ids([issue.id]))[issue.id])
        added = [a for a in wanted if a.id not in current]
        removed = current - {a.id for a in wanted}
        if removed:
            await self.session.execute(
                delete(IssueAssignee).where(IssueAssignee.issue_id == issue.id, IssueAssignee.account_id.in_(removed))
            )
            names = await self.accounts(set(removed))
            for account_id in sorted(removed):
                self.record(issue, actor, "unassigned", assignee=names[account_id].login if account_id in names else "")
        for account in added:
            self.session.add(
                IssueAssignee(issue_id=issue.id, account_id=account.id, assigned_by_id=actor.principal.account_id)
            )
            self.record(issue, actor, "assigned", assignee=account.login, type="Bot" if account.is_bot else "User")
        if added or removed:
            audit.record(
                self.session, actor, "repo.issue.assignees", f"{res.full_name}#{issue.number}",
                added=[a.login for a in added], removed=len(removed),
            )  # fmt: skip
        await self.session.flush()
        for account in added if publish else []:
            ref = (await self.accounts({account.id}))[account.id]
            await self.publish(actor, res, issue, "assigned", assignee=ref)
        bots = [a for a in added if a.is_bot]
        if bots:
            await issue_agents.assigned(self.session, self.agents, actor, res, issue, bots, self.record)

    async def _assignable(self, res: RepoResource, logins: list[str]) -> list[Account]:
        keys = list(dict.fromkeys(login.strip().lower() for login in logins if login.strip()))
        if len(keys) > MAX_ASSIGNEES:
            raise InvalidInput(f"an issue has at most {MAX_ASSIGNEES} assignees", code=Code.TOO_MANY_ASSIGNEES)
        if not keys:
            return []
        found = list((await self.session.execute(select(Account).where(Account.login_key.in_(keys)))).scalars())
        roles = await resource_roles(self.session, res, [a.id for a in found])
        ok = [a for a in found if a.id in roles]
        missing = sorted(set(keys) - {a.login_key for a in ok})
        if missing:
            raise InvalidInput(
                f"cannot assign {', '.join(missing)}: assignees are accounts that can read {res.full_name}",
                code=Code.INVALID_ASSIGNEE,
                assignees=missing,
            )
        order = {k: n for n, k in enumerate(keys)}
        return sorted(ok, key=lambda a: order[a.login_key])

    async def _set_milestone(self, actor: Actor, res: RepoResource, issue: Issue, number: int) -> None:
        before = await self.session.get(Milestone, issue.milestone_id) if issue.milestone_id else None
        after = await Labels(self.session, self.base_url).milestone(res, number) if number else None
        if (before.id if before else None) == (after.id if after else None):
            return
        if before is not None:
            self.record(issue, actor, "demilestoned", milestone=before.title)
        if after is not None:
            self.record(issue, actor, "milestoned", milestone=after.title)
        issue.milestone_id = after.id if after else None
        audit.record(
            self.session, actor, "repo.issue.milestone", f"{res.full_name}#{issue.number}",
            milestone=after.title if after else None,
        )  # fmt: skip
