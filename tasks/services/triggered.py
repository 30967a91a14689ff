"""A task started by something other than a person's start (a schedule's time, a bot assigned to
an issue or mentioned in a comment, a review request), as the person it is started for: their
account as they are now (disabled or gone: refused), their rights on the repository checked by
the start rule like any start, and the trigger kept on the task.

    task = await start_triggered(
        svc, starter_id=S.id, repo=R, data=TaskCreate(goal=G, agent=B.login, ...),
        trigger=Trigger.for_issue(7),
    )

`svc` is a `TaskService` on the caller's write session (`TaskSystem.service(session)`: in a request
its `db_session`; in a background loop a `db.session(write=True)` of its own). Everything happens in
that transaction: a refusal (`ForgeError`) leaves what the caller wrote before it, so run the call
in a savepoint (`session.begin_nested()`) to keep going after one."""

from forge.core.access import Principal
from forge.core.errors import Forbidden
from forge.db.audit import Actor
from forge.db.models import Account, Repository
from forge.repos.repositories import resource_for
from tasks.core.models import Task
from tasks.core.schemas import TaskCreate, Trigger
from tasks.services import rules
from tasks.services.tasks import TaskService


def principal_of(account: Account) -> Principal:
    """The account acting with all its rights (no token narrows them), as a browser session does."""
    return Principal(
        account_id=account.id,
        login=account.login,
        type="Bot" if account.is_bot else "User",
        is_admin=account.is_admin,
        via="session",
    )


async def starter_actor(svc: TaskService, starter_id: int | None) -> Actor:
    """The starter as they are now; refused with the reason when they cannot start anything."""
    starter = await svc.session.get(Account, starter_id) if starter_id is not None else None
    if starter is None:
        raise Forbidden("the account that would start the task no longer exists")
    if starter.disabled:
        raise Forbidden(f"{starter.login} is disabled")
    return Actor(principal=principal_of(starter))


async def start_triggered(
    svc: TaskService, *, starter_id: int | None, repo: Repository, data: TaskCreate, trigger: Trigger
) -> Task:
    """Start `data` on `repo` as account `starter_id`, marked with `trigger` (see the module's doc)."""
    actor = await starter_actor(svc, starter_id)
    res = await resource_for(svc.session, repo, actor.principal)
    if not rules.may_start(actor.principal, res):
        raise Forbidden(f"{actor.principal.login} may no longer start tasks in {res.full_name}")
    return await svc.start(actor, res, data, trigger=trigger)
