"""REST: the caller's notifications at GitHub's paths and in its shapes (`/api/v1/notifications`,
threads, mark read, mark done, mark all read) and watching a repository (`.../subscription`).
A token needs the `notifications` scope (docs/notifications.md)."""

from datetime import datetime
from typing import Annotated, Literal

import msgspec
from litestar import Controller, Response, delete, get, patch, put
from litestar.params import FromPath, FromQuery, JSONBody, QueryParameter

from forge.core.access import Principal, Scope
from forge.core.error_codes import Code
from forge.core.errors import Forbidden, InvalidInput, Unauthenticated
from forge.http.auth import signed_in
from forge.http.deps import ActorDep, BaseUrlDep, DbSession, PathRepoDep
from forge.notify import inbox, subscriptions
from forge.notify.inbox import Filters, MarkedRead, NotificationRead
from forge.notify.reasons import REASONS
from forge.notify.subscriptions import SubscriptionPut, SubscriptionRead

REPO = "/api/v1/repos/{owner:str}/{name:str}"

PageQuery = Annotated[int, QueryParameter(ge=1, le=100_000)]
PerPageQuery = Annotated[int, QueryParameter(ge=1, le=50)]
ReasonQuery = Annotated[str | None, QueryParameter(max_length=24)]


class MarkAllRead(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """GitHub's body of `PUT /notifications`: threads updated up to `last_read_at` (default now)."""

    last_read_at: datetime | None = None
    read: Literal[True] = True


def _account(principal: Principal) -> int:
    """The caller's account id, once the token's `notifications` scope is checked."""
    if principal.account_id is None:
        raise Unauthenticated("sign in or send a token")
    if not principal.has_scope(Scope.NOTIFICATIONS):
        raise Forbidden("this token lacks the 'notifications' scope", code=Code.INSUFFICIENT_SCOPE)
    return principal.account_id


def _filters(all_: bool, participating: bool, reason: str | None) -> Filters:
    if reason is not None and reason not in REASONS:
        raise InvalidInput(f"reason must be one of {', '.join(REASONS)}", code=Code.VALIDATION_FAILED)
    return Filters(all=all_, participating=participating, reason=reason)


class NotificationController(Controller):
    path = "/api/v1/notifications"
    guards = [signed_in]
    tags = ["notifications"]

    @get("/", summary="The caller's notification threads, newest activity first (GitHub's shape)")
    async def list_notifications(
        self,
        db_session: DbSession,
        actor: ActorDep,
        forge_url: BaseUrlDep,
        all_: Annotated[bool, QueryParameter(name="all")] = False,
        participating: FromQuery[bool] = False,
        reason: ReasonQuery = None,
        page: PageQuery = 1,
        per_page: PerPageQuery = 50,
    ) -> list[NotificationRead]:
        account_id = _account(actor.principal)
        filters = _filters(all_, participating, reason)
        return await inbox.list_for(db_session, account_id, filters, forge_url, page=page, per_page=per_page)

    @put("/", summary="Mark every notification read (GitHub's `last_read_at` bounds it)", status_code=200)
    async def mark_all_read(
        self, db_session: DbSession, actor: ActorDep, data: JSONBody[MarkAllRead | None] = None
    ) -> MarkedRead:
        _account(actor.principal)
        return await inbox.mark_all(db_session, actor, data.last_read_at if data is not None else None)

    @get(["/{thread_id:int}", "/threads/{thread_id:int}"], summary="One notification thread")
    async def get_thread(
        self, db_session: DbSession, actor: ActorDep, forge_url: BaseUrlDep, thread_id: FromPath[int]
    ) -> NotificationRead:
        return await inbox.get(db_session, _account(actor.principal), thread_id, forge_url)

    @patch(["/{thread_id:int}", "/threads/{thread_id:int}"], summary="Mark a thread read")
    async def mark_read(
        self, db_session: DbSession, actor: ActorDep, forge_url: BaseUrlDep, thread_id: FromPath[int]
    ) -> NotificationRead:
        _account(actor.principal)
        return await inbox.mark(db_session, actor, thread_id, forge_url)

    @delete(["/{thread_id:int}", "/threads/{thread_id:int}"], summary="Mark a thread done (out of the inbox)")
    async def mark_done(
        self, db_session: DbSession, actor: ActorDep, forge_url: BaseUrlDep, thread_id: FromPath[int]
    ) -> None:
        _account(actor.principal)
        await inbox.mark(db_session, actor, thread_id, forge_url, done=True)


class SubscriptionController(Controller):
    """Watching a repository: GitHub's `subscribed`/`ignored`, and forgehand's `level`."""

    path = REPO + "/subscription"
    guards = [signed_in]
    tags = ["notifications"]

    @get("/", summary="How the caller watches the repository")
    async def get_subscription(
        self, db_session: DbSession, actor: ActorDep, path_repo: PathRepoDep, forge_url: BaseUrlDep
    ) -> SubscriptionRead:
        account_id = _account(actor.principal)
        return await subscriptions.get(db_session, await path_repo.load(), account_id, forge_url)

    @put("/", summary="Watch the repository: all activity, participating, or ignore", status_code=200)
    async def put_subscription(
        self,
        db_session: DbSession,
        actor: ActorDep,
        path_repo: PathRepoDep,
        forge_url: BaseUrlDep,
        data: JSONBody[SubscriptionPut],
    ) -> SubscriptionRead:
        _account(actor.principal)
        res = await path_repo.load()
        return await subscriptions.put(db_session, actor, res, subscriptions.level_of(data), forge_url)

    @delete("/", summary="Back to the default (participating)")
    async def delete_subscription(
        self, db_session: DbSession, actor: ActorDep, path_repo: PathRepoDep
    ) -> Response[None]:
        _account(actor.principal)
        await subscriptions.remove(db_session, actor, await path_repo.load())
        return Response(None, status_code=204)
