"""Labels and milestones of a repository (docs/issues.md). Anyone who can read the repository sees
them; the write role creates, changes and deletes them. Each change is audited."""

from dataclasses import dataclass

from sqlalchemy import case, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from forge.core.access import Action, require
from forge.core.error_codes import Code
from forge.core.errors import Conflict, InvalidInput, NotFound
from forge.db import audit
from forge.db.audit import Actor
from forge.db.engine import utcnow
from forge.db.issue_models import Issue, Label, Milestone
from forge.repos.issue_shapes import (
    LabelCreate,
    LabelRead,
    LabelUpdate,
    MilestoneCreate,
    MilestoneRead,
    MilestoneUpdate,
)
from forge.repos.repositories import RepoResource

MAX_REPO_LABELS = 500


def label_name(raw: str) -> str:
    name = " ".join(raw.split())
    if not name or not name.isprintable() or len(name) > 50 or "," in name:
        raise InvalidInput(
            f"label {raw[:60]!r}: a label is 1-50 printable characters without commas",
            code=Code.INVALID_LABEL,
            field="name",
        )
    return name


@dataclass
class Labels:
    """The labels and milestones of the request's transaction."""

    session: AsyncSession
    base_url: str

    # -- labels ----------------------------------------------------------------------------

    def read(self, res: RepoResource, label: Label) -> LabelRead:
        return LabelRead(
            id=label.id,
            name=label.name,
            color=label.color,
            description=label.description,
            url=f"{self.base_url}/{res.full_name}/labels/{label.name}",
        )

    async def all(self, res: RepoResource) -> list[Label]:
        stmt = select(Label).where(Label.repo_id == res.repo.id).order_by(Label.name_key)
        return list((await self.session.execute(stmt)).scalars())

    async def find(self, res: RepoResource, name: str) -> Label:
        stmt = select(Label).where(Label.repo_id == res.repo.id, Label.name_key == name.strip().casefold())
        label = (await self.session.execute(stmt)).scalar_one_or_none()
        if label is None:
            raise NotFound(f"{res.full_name} has no label {name[:60]!r}", code=Code.LABEL_NOT_FOUND)
        return label

    async def resolve(self, res: RepoResource, names: list[str]) -> list[Label]:
        """The labels named (in any case); an unknown name is refused, naming it."""
        keys = sorted({n.strip().casefold() for n in names if n.strip()})
        if not keys:
            return []
        stmt = select(Label).where(Label.repo_id == res.repo.id, Label.name_key.in_(keys))
        found = list((await self.session.execute(stmt)).scalars())
        missing = sorted(set(keys) - {label.name_key for label in found})
        if missing:
            raise InvalidInput(
                f"{res.full_name} has no label {', '.join(missing)}: create it on the labels page first",
                code=Code.LABEL_NOT_FOUND,
                labels=missing,
            )
        return found

    async def create(self, actor: Actor, res: RepoResource, data: LabelCreate) -> Label:
        require(actor.principal, Action.ISSUE_TRIAGE, res)
        count = await self.session.scalar(select(func.count()).where(Label.repo_id == res.repo.id))
        if (count or 0) >= MAX_REPO_LABELS:
            raise InvalidInput(f"a repository has at most {MAX_REPO_LABELS} labels", code=Code.TOO_MANY_LABELS)
        name = label_name(data.name)
        label = Label(
            repo_id=res.repo.id,
            name=name,
            name_key=name.casefold(),
            color=data.color.removeprefix("#").lower(),
            description=data.description.strip(),
        )
        await self._save(label, name)
        audit.record(self.session, actor, "repo.label.create", res.full_name, label=name)
        return label

    async def update(self, actor: Actor, res: RepoResource, name: str, data: LabelUpdate) -> Label:
        require(actor.principal, Action.ISSUE_TRIAGE, res)
        label = await self.find(res, name)
        if data.new_name is not None:
            label.name = label_name(data.new_name)
            label.name_key = label.name.casefold()
        if data.color is not None:
            label.color = data.color.removeprefix("#").lower()
        if data.description is not None:
            label.description = data.description.strip()
        await self._save(label, label.name)
        audit.record(self.session, actor, "repo.label.edit", res.full_name, label=name, now=label.name)
        return label

    async def delete(self, actor: Actor, res: RepoResource, name: str) -> None:
        require(actor.principal, Action.ISSUE_TRIAGE, res)
        label = await self.find(res, name)
        await self.session.delete(label)
        audit.record(self.session, actor, "repo.label.delete", res.full_name, label=label.name)

    async def _save(self, label: Label, name: str) -> None:
        try:
            async with self.session.begin_nested():
                self.session.add(label)
                await self.session.flush()
        except IntegrityError:
            raise Conflict(f"a label named {name!r} (in some case) exists", code=Code.LABEL_EXISTS) from None

    # -- milestones ------------------------------------------------------------------------

    async def milestones(self, res: RepoResource, state: str = "open") -> list[Milestone]:
        stmt = select(Milestone).where(Milestone.repo_id == res.repo.id)
        if state != "all":
            stmt = stmt.where(Milestone.state == state)
        stmt = stmt.order_by(Milestone.due_on.is_(None), Milestone.due_on, Milestone.number)
        return list((await self.session.execute(stmt)).scalars())

    async def milestone(self, res: RepoResource, number: int) -> Milestone:
        stmt = select(Milestone).where(Milestone.repo_id == res.repo.id, Milestone.number == number)
        found = (await self.session.execute(stmt)).scalar_one_or_none()
        if found is None:
            raise NotFound(f"{res.full_name} has no milestone #{number}", code=Code.MILESTONE_NOT_FOUND)
        return found

    async def milestone_reads(self, res: RepoResource, found: list[Milestone]) -> list[MilestoneRead]:
        ids = [m.id for m in found]
        counts: dict[int, tuple[int, int]] = {}
        if ids:
            closed = func.sum(case((Issue.state == "closed", 1), else_=0))
            rows = await self.session.execute(
                select(Issue.milestone_id, func.count(), closed)
                .where(Issue.milestone_id.in_(ids))
                .group_by(Issue.milestone_id)
            )
            counts = {mid: (int(total) - int(c or 0), int(c or 0)) for mid, total, c in rows.all()}
        return [self._milestone_read(res, m, *counts.get(m.id, (0, 0))) for m in found]

    def _milestone_read(self, res: RepoResource, m: Milestone, open_: int, closed: int) -> MilestoneRead:
        return MilestoneRead(
            id=m.id,
            number=m.number,
            title=m.title,
            description=m.description,
            state=m.state,  # type: ignore[arg-type]
            open_issues=open_,
            closed_issues=closed,
            due_on=m.due_on,
            closed_at=m.closed_at,
            html_url=f"{self.base_url}/{res.full_name}/milestone/{m.number}",
        )

    async def create_milestone(self, actor: Actor, res: RepoResource, data: MilestoneCreate) -> Milestone:
        require(actor.principal, Action.ISSUE_TRIAGE, res)
        last = await self.session.scalar(select(func.max(Milestone.number)).where(Milestone.repo_id == res.repo.id))
        title = " ".join(data.title.split())
        found = Milestone(
            repo_id=res.repo.id,
            number=(last or 0) + 1,
            title=title,
            title_key=title.casefold(),
            description=data.description,
            due_on=data.due_on,
            state=data.state,
            closed_at=utcnow() if data.state == "closed" else None,
        )
        await self._save_milestone(found)
        audit.record(self.session, actor, "repo.milestone.create", res.full_name, milestone=title)
        return found

    async def update_milestone(self, actor: Actor, res: RepoResource, number: int, data: MilestoneUpdate) -> Milestone:
        require(actor.principal, Action.ISSUE_TRIAGE, res)
        found = await self.milestone(res, number)
        if data.title is not None:
            found.title = " ".join(data.title.split())
            found.title_key = found.title.casefold()
        if data.description is not None:
            found.description = data.description
        if data.due_on is not None:
            found.due_on = data.due_on
        if data.state is not None and data.state != found.state:
            found.state, found.closed_at = data.state, utcnow() if data.state == "closed" else None
        await self._save_milestone(found)
        audit.record(self.session, actor, "repo.milestone.edit", res.full_name, milestone=found.title)
        return found

    async def delete_milestone(self, actor: Actor, res: RepoResource, number: int) -> None:
        require(actor.principal, Action.ISSUE_TRIAGE, res)
        found = await self.milestone(res, number)
        await self.session.delete(found)
        audit.record(self.session, actor, "repo.milestone.delete", res.full_name, milestone=found.title)

    async def _save_milestone(self, found: Milestone) -> None:
        try:
            async with self.session.begin_nested():
                self.session.add(found)
                await self.session.flush()
        except IntegrityError:
            raise Conflict(
                f"a milestone titled {found.title!r} (in some case) exists", code=Code.MILESTONE_EXISTS
            ) from None
