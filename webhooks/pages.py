"""Web pages for webhook endpoints: `/admin/hooks` (instance) and `/{owner}/{name}/settings/hooks`
(a repository). The same services as the REST API; forms work without JavaScript."""

from typing import Any

import msgspec
from litestar import Controller, Request, get, post
from litestar.params import FromPath, URLEncodedBody
from litestar.response import Redirect, Template
from sqlalchemy.ext.asyncio import AsyncSession

from forge.access import INSTANCE, Action, require
from forge.audit import Actor
from forge.deps import ActorDep, DbSession
from forge.errors import ForgeError, Unauthenticated
from forge.models import Repository
from forge.pages import page
from webhooks import service
from webhooks.models import WebhookEndpoint
from webhooks.outbox import wake_after_commit
from webhooks.protocol import NOTIFY_EVENTS, POLICY_EVENTS
from webhooks.repo_access import repo_for_hooks_admin
from webhooks.routes import HOOK_DEPENDENCIES, RuntimeDep
from webhooks.runtime import WebhooksRuntime
from webhooks.schemas import FailurePolicy, HookCreate, HookUpdate


class HookForm(msgspec.Struct, kw_only=True):
    url: str = ""
    kind: str = "notify"
    events: list[str] | str = msgspec.field(default_factory=list)
    failure_policy: str = "closed"
    active: str = ""
    csrf_token: str = ""

    def event_list(self) -> list[str]:
        return [self.events] if isinstance(self.events, str) else list(self.events)


def _failure_policy(value: str) -> FailurePolicy | None:
    if value == "open":
        return "open"
    if value == "hold":
        return "hold"
    return "closed" if value == "closed" else None


def _signed_in(request: Request[Any, Any, Any]) -> None:
    principal = request.scope.get("user")
    if principal is None or not principal.is_authenticated:
        raise Unauthenticated("sign in first", code="unauthenticated")


class _Pages:
    """Rendering and actions of one scope (a repository, or the instance when `repo` is None)."""

    def __init__(
        self,
        request: Request[Any, Any, Any],
        session: AsyncSession,
        actor: Actor,
        runtime: WebhooksRuntime,
        repo: Repository | None,
        base: str,
    ) -> None:
        self.request, self.s, self.actor, self.rt, self.repo, self.base = request, session, actor, runtime, repo, base

    def _ctx(self) -> dict[str, Any]:
        return {
            "base": self.base,
            "scope_name": f"{self.repo.owner.login}/{self.repo.name}" if self.repo else "this instance",
            "policy_events": POLICY_EVENTS,
            "notify_events": NOTIFY_EVENTS,
        }

    async def list_page(self, status_code: int = 200, **context: Any) -> Template:
        endpoints = await service.list_endpoints(self.s, self.repo)
        return page(
            self.request,
            "webhooks/list.html",
            status_code=status_code,
            hooks=[service.to_read(e, self.repo) for e in endpoints],
            **self._ctx(),
            **context,
        )

    async def detail_page(self, endpoint: WebhookEndpoint, status_code: int = 200, **context: Any) -> Template:
        deliveries = await service.list_deliveries(self.s, endpoint, limit=50)
        return page(
            self.request,
            "webhooks/detail.html",
            status_code=status_code,
            hook=service.to_read(endpoint, self.repo),
            deliveries=deliveries,
            queued=self.request.query_params.get("queued", ""),
            **self._ctx(),
            **context,
        )

    async def create(self, form: HookForm) -> Template:
        try:
            data = HookCreate(
                url=form.url.strip(),
                kind="policy" if form.kind == "policy" else "notify",
                events=form.event_list(),
                failure_policy=_failure_policy(form.failure_policy) or "closed",
                active=True,
            )
            endpoint, secret = await service.create_endpoint(self.s, self.actor, self.rt.config, self.repo, data)
        except ForgeError as exc:
            return await self.list_page(status_code=exc.status, error=exc.detail, form=form)
        return await self.detail_page(endpoint, created_secret=secret, created_kid=endpoint.secret_kid)

    async def edit(self, hook_id: int, form: HookForm) -> Template | Redirect:
        endpoint = await service.get_endpoint(self.s, self.repo, hook_id)
        try:
            data = HookUpdate(
                url=form.url.strip() or None,
                events=form.event_list() or None,
                failure_policy=_failure_policy(form.failure_policy),
                active=bool(form.active),
            )
            if endpoint.kind == "notify":
                data.failure_policy = None
            await service.update_endpoint(self.s, self.actor, self.rt.config, self.repo, endpoint, data)
        except ForgeError as exc:
            return await self.detail_page(endpoint, status_code=exc.status, error=exc.detail)
        if endpoint.active:
            wake_after_commit(self.s, self.rt.wake)
        return Redirect(f"{self.base}/{hook_id}", status_code=303)

    async def rotate(self, hook_id: int, step: str) -> Template | Redirect:
        endpoint = await service.get_endpoint(self.s, self.repo, hook_id)
        cfg = self.rt.config
        try:
            if step == "generate":
                endpoint, secret, kid = await service.rotate_generate(self.s, self.actor, cfg, self.repo, endpoint)
                return await self.detail_page(endpoint, created_secret=secret, created_kid=kid, rotated=True)
            if step == "promote":
                await service.rotate_promote(self.s, self.actor, cfg, self.repo, endpoint)
            else:
                await service.rotate_retire(self.s, self.actor, cfg, self.repo, endpoint)
        except ForgeError as exc:
            return await self.detail_page(endpoint, status_code=exc.status, error=exc.detail)
        return Redirect(f"{self.base}/{hook_id}", status_code=303)

    async def ping(self, hook_id: int) -> Redirect:
        endpoint = await service.get_endpoint(self.s, self.repo, hook_id)
        row = await service.ping(self.s, self.actor, self.rt.config, self.repo, endpoint)
        wake_after_commit(self.s, self.rt.wake)
        return Redirect(f"{self.base}/{hook_id}?queued={row.wid}", status_code=303)

    async def delete(self, hook_id: int) -> Redirect:
        endpoint = await service.get_endpoint(self.s, self.repo, hook_id)
        await service.delete_endpoint(self.s, self.actor, self.repo, endpoint)
        return Redirect(self.base, status_code=303)

    async def delivery_page(self, hook_id: int, delivery_id: int) -> Template:
        endpoint = await service.get_endpoint(self.s, self.repo, hook_id)
        detail = await service.get_delivery(self.s, endpoint, delivery_id)
        return page(
            self.request,
            "webhooks/delivery.html",
            hook=service.to_read(endpoint, self.repo),
            d=detail,
            **self._ctx(),
        )

    async def redeliver(self, hook_id: int, delivery_id: int) -> Redirect:
        endpoint = await service.get_endpoint(self.s, self.repo, hook_id)
        row = await service.redeliver(self.s, self.actor, self.rt.config, self.repo, endpoint, delivery_id)
        wake_after_commit(self.s, self.rt.wake)
        return Redirect(f"{self.base}/{hook_id}?queued={row.wid}", status_code=303)


async def _repo_pages(
    request: Request[Any, Any, Any],
    session: AsyncSession,
    actor: Actor,
    runtime: WebhooksRuntime,
    owner: str,
    name: str,
) -> _Pages:
    _signed_in(request)
    repo = await repo_for_hooks_admin(session, actor.principal, owner, name)
    return _Pages(request, session, actor, runtime, repo, f"/{repo.owner.login}/{repo.name}/settings/hooks")


def _instance_pages(
    request: Request[Any, Any, Any], session: AsyncSession, actor: Actor, runtime: WebhooksRuntime
) -> _Pages:
    _signed_in(request)
    require(actor.principal, Action.INSTANCE_ADMIN, INSTANCE)
    return _Pages(request, session, actor, runtime, None, "/admin/hooks")


Req = Request[Any, Any, Any]


class InstanceHookPages(Controller):
    path = "/admin/hooks"
    include_in_schema = False
    dependencies = HOOK_DEPENDENCIES

    @get("/")
    async def index(
        self, request: Req, db_session: DbSession, actor: ActorDep, webhooks_runtime: RuntimeDep
    ) -> Template:
        return await _instance_pages(request, db_session, actor, webhooks_runtime).list_page()

    @post("/")
    async def create(
        self,
        request: Req,
        db_session: DbSession,
        actor: ActorDep,
        webhooks_runtime: RuntimeDep,
        data: URLEncodedBody[HookForm],
    ) -> Template:
        return await _instance_pages(request, db_session, actor, webhooks_runtime).create(data)

    @get("/{hook_id:int}")
    async def detail(
        self, request: Req, db_session: DbSession, actor: ActorDep, webhooks_runtime: RuntimeDep, hook_id: FromPath[int]
    ) -> Template:
        pages = _instance_pages(request, db_session, actor, webhooks_runtime)
        return await pages.detail_page(await service.get_endpoint(db_session, None, hook_id))

    @post("/{hook_id:int}/edit")
    async def edit(
        self,
        request: Req,
        db_session: DbSession,
        actor: ActorDep,
        webhooks_runtime: RuntimeDep,
        hook_id: FromPath[int],
        data: URLEncodedBody[HookForm],
    ) -> Template | Redirect:
        return await _instance_pages(request, db_session, actor, webhooks_runtime).edit(hook_id, data)

    @post("/{hook_id:int}/rotate/{step:str}")
    async def rotate(
        self,
        request: Req,
        db_session: DbSession,
        actor: ActorDep,
        webhooks_runtime: RuntimeDep,
        hook_id: FromPath[int],
        step: FromPath[str],
    ) -> Template | Redirect:
        return await _instance_pages(request, db_session, actor, webhooks_runtime).rotate(hook_id, step)

    @post("/{hook_id:int}/ping")
    async def ping(
        self, request: Req, db_session: DbSession, actor: ActorDep, webhooks_runtime: RuntimeDep, hook_id: FromPath[int]
    ) -> Redirect:
        return await _instance_pages(request, db_session, actor, webhooks_runtime).ping(hook_id)

    @post("/{hook_id:int}/delete")
    async def delete(
        self, request: Req, db_session: DbSession, actor: ActorDep, webhooks_runtime: RuntimeDep, hook_id: FromPath[int]
    ) -> Redirect:
        return await _instance_pages(request, db_session, actor, webhooks_runtime).delete(hook_id)

    @get("/{hook_id:int}/deliveries/{delivery_id:int}")
    async def delivery(
        self,
        request: Req,
        db_session: DbSession,
        actor: ActorDep,
        webhooks_runtime: RuntimeDep,
        hook_id: FromPath[int],
        delivery_id: FromPath[int],
    ) -> Template:
        return await _instance_pages(request, db_session, actor, webhooks_runtime).delivery_page(hook_id, delivery_id)

    @post("/{hook_id:int}/deliveries/{delivery_id:int}/redeliver")
    async def redeliver(
        self,
        request: Req,
        db_session: DbSession,
        actor: ActorDep,
        webhooks_runtime: RuntimeDep,
        hook_id: FromPath[int],
        delivery_id: FromPath[int],
    ) -> Redirect:
        return await _instance_pages(request, db_session, actor, webhooks_runtime).redeliver(hook_id, delivery_id)


class RepoHookPages(Controller):
    path = "/{owner:str}/{name:str}/settings/hooks"
    include_in_schema = False
    dependencies = HOOK_DEPENDENCIES

    @get("/")
    async def index(
        self,
        request: Req,
        db_session: DbSession,
        actor: ActorDep,
        webhooks_runtime: RuntimeDep,
        owner: FromPath[str],
        name: FromPath[str],
    ) -> Template:
        return await (await _repo_pages(request, db_session, actor, webhooks_runtime, owner, name)).list_page()

    @post("/")
    async def create(
        self,
        request: Req,
        db_session: DbSession,
        actor: ActorDep,
        webhooks_runtime: RuntimeDep,
        owner: FromPath[str],
        name: FromPath[str],
        data: URLEncodedBody[HookForm],
    ) -> Template:
        return await (await _repo_pages(request, db_session, actor, webhooks_runtime, owner, name)).create(data)

    @get("/{hook_id:int}")
    async def detail(
        self,
        request: Req,
        db_session: DbSession,
        actor: ActorDep,
        webhooks_runtime: RuntimeDep,
        owner: FromPath[str],
        name: FromPath[str],
        hook_id: FromPath[int],
    ) -> Template:
        pages = await _repo_pages(request, db_session, actor, webhooks_runtime, owner, name)
        return await pages.detail_page(await service.get_endpoint(db_session, pages.repo, hook_id))

    @post("/{hook_id:int}/edit")
    async def edit(
        self,
        request: Req,
        db_session: DbSession,
        actor: ActorDep,
        webhooks_runtime: RuntimeDep,
        owner: FromPath[str],
        name: FromPath[str],
        hook_id: FromPath[int],
        data: URLEncodedBody[HookForm],
    ) -> Template | Redirect:
        return await (await _repo_pages(request, db_session, actor, webhooks_runtime, owner, name)).edit(hook_id, data)

    @post("/{hook_id:int}/rotate/{step:str}")
    async def rotate(
        self,
        request: Req,
        db_session: DbSession,
        actor: ActorDep,
        webhooks_runtime: RuntimeDep,
        owner: FromPath[str],
        name: FromPath[str],
        hook_id: FromPath[int],
        step: FromPath[str],
    ) -> Template | Redirect:
        return await (await _repo_pages(request, db_session, actor, webhooks_runtime, owner, name)).rotate(
            hook_id, step
        )

    @post("/{hook_id:int}/ping")
    async def ping(
        self,
        request: Req,
        db_session: DbSession,
        actor: ActorDep,
        webhooks_runtime: RuntimeDep,
        owner: FromPath[str],
        name: FromPath[str],
        hook_id: FromPath[int],
    ) -> Redirect:
        return await (await _repo_pages(request, db_session, actor, webhooks_runtime, owner, name)).ping(hook_id)

    @post("/{hook_id:int}/delete")
    async def delete(
        self,
        request: Req,
        db_session: DbSession,
        actor: ActorDep,
        webhooks_runtime: RuntimeDep,
        owner: FromPath[str],
        name: FromPath[str],
        hook_id: FromPath[int],
    ) -> Redirect:
        return await (await _repo_pages(request, db_session, actor, webhooks_runtime, owner, name)).delete(hook_id)

    @get("/{hook_id:int}/deliveries/{delivery_id:int}")
    async def delivery(
        self,
        request: Req,
        db_session: DbSession,
        actor: ActorDep,
        webhooks_runtime: RuntimeDep,
        owner: FromPath[str],
        name: FromPath[str],
        hook_id: FromPath[int],
        delivery_id: FromPath[int],
    ) -> Template:
        pages = await _repo_pages(request, db_session, actor, webhooks_runtime, owner, name)
        return await pages.delivery_page(hook_id, delivery_id)

    @post("/{hook_id:int}/deliveries/{delivery_id:int}/redeliver")
    async def redeliver(
        self,
        request: Req,
        db_session: DbSession,
        actor: ActorDep,
        webhooks_runtime: RuntimeDep,
        owner: FromPath[str],
        name: FromPath[str],
        hook_id: FromPath[int],
        delivery_id: FromPath[int],
    ) -> Redirect:
        pages = await _repo_pages(request, db_session, actor, webhooks_runtime, owner, name)
        return await pages.redeliver(hook_id, delivery_id)
