"""The scope of a webhook administration request, resolved once by one dependency that the REST
controllers and the pages share: the instance (for an instance admin) on `/api/v1/admin/hooks`
and `/admin/hooks`, or the repository `{owner}/{name}` of the path (for whoever may administer
its webhooks) on `/api/v1/repos/{owner}/{name}/hooks` and `/{owner}/{name}/settings/hooks`.
Handlers then work on `HookScope.repo` (None: the instance) and never authorize again."""

from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

from litestar import Request
from litestar.datastructures import State
from litestar.di import NamedDependency, Provide
from sqlalchemy.ext.asyncio import AsyncSession

from forge.core.access import INSTANCE, Action, require
from forge.core.errors import Unauthenticated, Unavailable
from forge.db.audit import Actor
from forge.db.engine import Database
from forge.db.models import Repository
from forge.http.deps import SAFE_METHODS, ActorDep
from forge.repos import repositories
from webhooks import service
from webhooks.core.config import WebhooksConfig
from webhooks.core.models import WebhookEndpoint
from webhooks.core.schemas import HookRead
from webhooks.delivery.outbox import wake_after_commit
from webhooks.wiring import WebhooksRuntime

# Route option of the pages: an anonymous visitor is sent to sign in before any access check
# (the REST API answers what the access rule says instead).
SIGN_IN_FIRST = "webhooks_sign_in_first"


@dataclass(frozen=True, slots=True)
class HookScope:
    """One authorized scope: its endpoints are `service.*(..., scope.repo, ...)`."""

    session: AsyncSession
    actor: Actor
    runtime: WebhooksRuntime
    repo: Repository | None  # None: the instance

    @property
    def config(self) -> WebhooksConfig:
        return self.runtime.config

    @property
    def pages_base(self) -> str:
        """Where the scope's web pages live."""
        return f"/{self.repo.owner.login}/{self.repo.name}/settings/hooks" if self.repo else "/admin/hooks"

    @property
    def name(self) -> str:
        return f"{self.repo.owner.login}/{self.repo.name}" if self.repo else "this instance"

    async def endpoint(self, hook_id: int) -> WebhookEndpoint:
        """One endpoint of this scope (404 for another scope's)."""
        return await service.get_endpoint(self.session, self.repo, hook_id)

    def read(self, endpoint: WebhookEndpoint) -> HookRead:
        return service.to_read(endpoint, self.repo)

    def wake_after_commit(self) -> None:
        """Let the deliverer go as soon as this request's transaction commits."""
        wake_after_commit(self.session, self.runtime.wake)


def provide_runtime(state: State) -> WebhooksRuntime:
    runtime = getattr(state, "webhooks", None)
    if not isinstance(runtime, WebhooksRuntime):
        raise Unavailable("webhooks are not set up on this server", code="webhooks_unavailable")
    return runtime


RuntimeDep = NamedDependency[WebhooksRuntime]


async def provide_hook_scope(
    request: Request[Any, Any, Any], state: State, actor: ActorDep, webhooks_runtime: RuntimeDep
) -> AsyncGenerator[HookScope, None]:
    """The request's transaction with the repository named by the path's `owner` and `name`
    (404 below read access, 403 below webhooks admin), else the instance (instance admins only).

    The scope opens the request's transaction itself rather than taking `db_session`: Litestar 2
    does not close a generator dependency when a later one raises, so a refusal here would leave
    that transaction (and SQLite's write lock) open. It commits when the handler returns and
    rolls back when it raises, like `db_session`."""
    if request.route_handler.opt.get(SIGN_IN_FIRST):
        principal = request.scope.get("user")
        if principal is None or not principal.is_authenticated:
            raise Unauthenticated("sign in first", code="unauthenticated")
    db: Database = state.db
    async with db.session(write=request.method not in SAFE_METHODS) as session:
        owner = request.path_params.get("owner")
        repo: Repository | None = None
        if owner is None:
            require(actor.principal, Action.INSTANCE_ADMIN, INSTANCE)
        else:
            # The host's one loader and access rule for repositories.
            name = request.path_params["name"]
            repo = (await repositories.load(session, actor.principal, owner, name, Action.WEBHOOKS_ADMIN)).repo
        yield HookScope(session, actor, webhooks_runtime, repo)


ScopeDep = NamedDependency[HookScope]
HOOK_DEPENDENCIES = {
    "webhooks_runtime": Provide(provide_runtime, sync_to_thread=False),
    "hook_scope": Provide(provide_hook_scope),
}
