"""Schedules, the use cases of repository admins: list, read, create, change, pause, delete.

A schedule is saved only when the task it describes could start now as the person saving it: the
same checks, and the same refusals, as a task start (`prepare_start`: the bot, the runtime and its
command, a model, the base branch), plus a cron expression and a time zone. Each change writes an
audit row in the caller's transaction and, once committed, wakes this process's schedule loop
(`changed`). Firing them is `schedule_runs.py`."""

from collections.abc import Callable, Sequence
from datetime import datetime

import msgspec
from msgspec import UNSET
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from forge.core.access import Principal
from forge.core.errors import Conflict, InvalidInput, NotFound
from forge.core.settings import Settings
from forge.core.text import require_no_nul
from forge.db import audit
from forge.db.audit import Actor
from forge.db.engine import after_commit, utcnow
from forge.db.models import Account
from forge.git import RepoStore
from forge.repos.repositories import RepoResource
from tasks.core.cron import check_cron, check_timezone, next_slot
from tasks.core.models import Schedule, Task
from tasks.core.schedule_schemas import ScheduleCreate, ScheduleRead, ScheduleUpdate, TaskLink
from tasks.core.schemas import TaskCreate
from tasks.services import rules
from tasks.services.starting import prepare_start

Clock = Callable[[], datetime]
# Fields that say what runs: changing one makes the person changing it the starter.
WHAT_RUNS = ("goal", "agent", "runtime", "command", "agent_command", "base", "title")


def task_create(s: Schedule | ScheduleCreate, agent: str) -> TaskCreate:
    """The start a schedule's run makes (as `POST .../tasks` would receive it)."""
    return TaskCreate(
        goal=s.goal,
        agent=agent,
        runtime=s.runtime,  # type: ignore[arg-type]  # stored from a checked RuntimeName
        command=s.command,
        agent_command=s.agent_command,
        base=s.base,
        title=s.title,
    )


class Schedules:
    """The schedules of repositories, on one session (the caller's transaction)."""

    def __init__(
        self,
        session: AsyncSession,
        settings: Settings,
        store: RepoStore,
        *,
        changed: Callable[[], None] | None = None,
        clock: Clock = utcnow,
    ) -> None:
        self.session = session
        self.settings = settings
        self.store = store
        self.changed = changed
        self.clock = clock

    # --- reads --------------------------------------------------------------------------------

    async def of_repo(self, principal: Principal, res: RepoResource) -> Sequence[Schedule]:
        rules.require_configure(principal, res)
        stmt = select(Schedule).where(Schedule.repo_id == res.repo.id).order_by(Schedule.name, Schedule.id)
        return (await self.session.execute(stmt)).scalars().all()

    async def get(self, principal: Principal, res: RepoResource, schedule_id: int) -> Schedule:
        rules.require_configure(principal, res)
        found = await self.session.get(Schedule, schedule_id)
        if found is None or found.repo_id != res.repo.id:
            raise NotFound("no such schedule in this repository", code="schedule_not_found")
        return found

    async def reads(self, res: RepoResource, schedules: Sequence[Schedule]) -> list[ScheduleRead]:
        """The API shapes of a page of schedules, in two queries (their accounts, their last tasks)."""
        ids = {s.agent_id for s in schedules} | {s.starter_id for s in schedules if s.starter_id}
        accounts = await self.session.execute(select(Account.id, Account.login).where(Account.id.in_(ids)))
        logins = dict(accounts.tuples().all())
        last = {s.last_task_id for s in schedules if s.last_task_id}
        tasks = await self.session.execute(select(Task.id, Task.number).where(Task.id.in_(last)))
        numbers = dict(tasks.tuples().all())
        return [self._read(res, s, logins, numbers) for s in schedules]

    def _read(self, res: RepoResource, s: Schedule, logins: dict[int, str], numbers: dict[int, int]) -> ScheduleRead:
        base_url = f"{self.settings.effective_base_url}/{res.full_name}"
        number = numbers.get(s.last_task_id) if s.last_task_id else None
        return ScheduleRead(
            id=s.id,
            name=s.name,
            cron=s.cron,
            timezone=s.timezone,
            goal=s.goal,
            title=s.title,
            agent=logins.get(s.agent_id),
            runtime=s.runtime,
            command=s.command,
            agent_command=s.agent_command,
            base=s.base,
            paused=s.paused,
            starter=logins.get(s.starter_id) if s.starter_id else None,
            next_run_at=None if s.paused else s.next_run_at,
            last_run_at=s.last_run_at,
            last_task=TaskLink(number=number, html_url=f"{base_url}/tasks/{number}") if number else None,
            last_skip_reason=s.last_skip_reason,
            html_url=f"{base_url}/settings/schedules/{s.id}",
            created_at=s.created_at,
            updated_at=s.updated_at,
        )

    # --- changes ------------------------------------------------------------------------------

    async def create(self, actor: Actor, res: RepoResource, data: ScheduleCreate) -> Schedule:
        rules.require_configure(actor.principal, res)
        cron, zone = check_cron(data.cron), check_timezone(data.timezone).key
        name = await self._free_name(res, data.name)
        _, agent = await prepare_start(
            self.session, self.settings, self.store, actor, res, task_create(data, data.agent)
        )
        schedule = Schedule(
            repo_id=res.repo.id,
            name=name,
            cron=cron,
            timezone=zone,
            goal=data.goal.strip(),
            title=data.title.strip(),
            agent_id=agent.id,
            runtime=data.runtime or ("command" if data.command is not None else "builtin"),
            command=data.command,
            agent_command=data.agent_command,
            base=data.base.strip(),
            paused=data.paused,
            starter_id=actor.principal.account_id,
            next_run_at=next_slot(cron, zone, self.clock()),
            last_skip_reason="",
        )
        self.session.add(schedule)
        await self.session.flush()
        self._audit(actor, res, "create", schedule)
        return schedule

    async def update(self, actor: Actor, res: RepoResource, schedule: Schedule, data: ScheduleUpdate) -> Schedule:
        rules.require_configure(actor.principal, res)
        given = {k: v for k, v in msgspec.structs.asdict(data).items() if v is not UNSET}
        if "name" in given and given["name"].strip() != schedule.name:
            schedule.name = await self._free_name(res, given["name"])
        if await self._changes_what_runs(schedule, given):
            await self._change_what_runs(actor, res, schedule, given)
        timing = {k: given[k] for k in ("cron", "timezone") if k in given}
        if "cron" in timing:
            schedule.cron = check_cron(timing["cron"])
        if "timezone" in timing:
            schedule.timezone = check_timezone(timing["timezone"]).key
        resumed = given.get("paused") is False and schedule.paused
        if "paused" in given:
            schedule.paused = given["paused"]
        if timing or resumed:  # the next slot from now: a resumed schedule does not catch up
            schedule.next_run_at = next_slot(schedule.cron, schedule.timezone, self.clock())
        schedule.updated_at = utcnow()
        await self.session.flush()
        self._audit(actor, res, "update", schedule, changed=sorted(given))
        return schedule

    async def _changes_what_runs(self, schedule: Schedule, given: dict[str, object]) -> bool:
        """Whether `given` changes what runs (the same values sent again change nothing)."""
        agent = await self.session.get(Account, schedule.agent_id)
        current = {**{k: getattr(schedule, k) for k in WHAT_RUNS if k != "agent"}, "agent": agent and agent.login}
        return any(k in given and given[k] != current[k] for k in WHAT_RUNS)

    async def _change_what_runs(
        self, actor: Actor, res: RepoResource, schedule: Schedule, given: dict[str, object]
    ) -> None:
        """The new fields, checked as a start by the person changing them, who becomes the starter."""
        agent_row = await self.session.get(Account, schedule.agent_id)
        current = msgspec.structs.asdict(task_create(schedule, agent_row.login if agent_row else ""))
        merged = msgspec.convert({**current, **{k: v for k, v in given.items() if k in WHAT_RUNS}}, TaskCreate)
        _, agent = await prepare_start(self.session, self.settings, self.store, actor, res, merged)
        schedule.goal, schedule.title, schedule.base = merged.goal.strip(), merged.title.strip(), merged.base.strip()
        schedule.agent_id = agent.id
        schedule.runtime = merged.runtime or ("command" if merged.command is not None else "builtin")
        schedule.command, schedule.agent_command = merged.command, merged.agent_command
        schedule.starter_id = actor.principal.account_id

    async def delete(self, actor: Actor, res: RepoResource, schedule: Schedule) -> None:
        rules.require_configure(actor.principal, res)
        self._audit(actor, res, "delete", schedule)
        await self.session.delete(schedule)
        await self.session.flush()

    async def _free_name(self, res: RepoResource, name: str) -> str:
        name = require_no_nul(name, "a name").strip()
        if not name:
            raise InvalidInput("a schedule needs a name", field="name")
        taken = await self.session.execute(
            select(Schedule.id).where(Schedule.repo_id == res.repo.id, Schedule.name == name).limit(1)
        )
        if taken.first() is not None:
            raise Conflict(f"this repository has a schedule named {name!r}", code="schedule_exists", field="name")
        return name

    def _audit(self, actor: Actor, res: RepoResource, what: str, s: Schedule, **extra: object) -> None:
        audit.record(
            self.session,
            actor,
            f"task.schedule.{what}",
            f"{res.full_name}/schedules/{s.id}",
            name=s.name,
            cron=s.cron,
            timezone=s.timezone,
            paused=s.paused,
            **extra,
        )
        changed = self.changed
        if changed is not None:
            after_commit(self.session, ("tasks.schedules.changed",), changed)
