"""The notifier: a subscriber of the domain event bus (`Notifier.__call__`, in the transaction of
the change, like the webhooks outbox), and `Notifications`, what the composition root holds (the
notifier and the mailer, started and stopped with the app or `forgehand worker`).

An event becomes an activity (forge.notify.activity), the activity its recipients
(forge.notify.recipients), each recipient's inbox thread written or bumped (forge.notify.inbox) and,
for those who chose e-mail, an outbox row (forge.notify.mail); a commit that wrote outbox rows
wakes the mailer. `notify` is the same path for a caller that has an activity of its own."""

from collections.abc import Callable

from sqlalchemy.ext.asyncio import AsyncSession

from forge.core.settings import Settings
from forge.db.engine import Database, after_commit
from forge.db.events import Event
from forge.db.models import Repository
from forge.notify import inbox
from forge.notify.activity import Activity, describe
from forge.notify.mail import outbox_row
from forge.notify.mailer import Mailer
from forge.notify.recipients import Recipient, resolve
from forge.notify.tasks import TaskLookup, no_tasks
from forge.repos.repositories import RepoResource

# session.info key: the (account, thread) pairs e-mailed in this transaction (one e-mail each,
# however many events of the thread the change publishes).
_MAILED = "forgehand.notify.mailed"


class Notifier:
    def __init__(
        self, settings: Settings, *, tasks: TaskLookup = no_tasks, wake_mailer: Callable[[], None] | None = None
    ) -> None:
        self.settings = settings
        self.tasks = tasks
        self.wake_mailer = wake_mailer

    async def __call__(self, session: AsyncSession, event: Event) -> None:
        if event.repo_id is None:
            return
        act = await describe(session, event, self.tasks)
        if act is None:
            return
        actor = event.actor.login if event.actor is not None else ""
        await self.notify(session, event.repo_id, act, actor)

    async def notify(self, session: AsyncSession, repo_id: int, act: Activity, actor_login: str) -> list[Recipient]:
        """Tell whoever `act` concerns (never `actor_login`), in the caller's transaction."""
        repo = await session.get(Repository, repo_id)
        if repo is None:
            return []
        res = RepoResource(repo=repo)
        recipients = await resolve(session, res, act, actor_login)
        await inbox.deliver(session, repo.id, act, recipients, actor_login)
        self._mail(session, res, act, recipients)
        return recipients

    def _mail(self, session: AsyncSession, res: RepoResource, act: Activity, recipients: list[Recipient]) -> None:
        if not self.settings.smtp_host:
            return
        if _MAILED not in session.info:
            session.info[_MAILED] = set()
            after_commit(session, _MAILED, lambda: session.info.pop(_MAILED, None))
        mailed: set[tuple[int, str, int]] = session.info[_MAILED]
        wrote = False
        for r in recipients:
            key = (r.account_id, act.subject.type, act.subject.number)
            if r.channel != "email" or key in mailed:
                continue
            mailed.add(key)
            session.add(outbox_row(self.settings, res.full_name, res.repo.id, act, r))
            wrote = True
        if wrote and self.wake_mailer is not None:
            after_commit(session, "forgehand.notify.mailer", self.wake_mailer)


class Notifications:
    """What the app holds on `app.state.notifications`: the bus subscriber and the mailer."""

    def __init__(self, db: Database, settings: Settings, *, tasks: TaskLookup = no_tasks) -> None:
        self.mailer = Mailer(db, settings)
        self.notifier = Notifier(settings, tasks=tasks, wake_mailer=self.mailer.wake)

    async def start(self) -> None:
        await self.mailer.start()

    async def stop(self) -> None:
        await self.mailer.stop()
