"""Web pages for webhook endpoints: `/admin/hooks` (instance) and `/{owner}/{name}/settings/hooks`
(a repository). One set of handlers serves both scopes (the `hook_scope` dependency of
`webhooks.http.hook_scope`, which sends anonymous visitors to sign in first); the same services as the REST
API; forms work without JavaScript."""

from typing import Any

import msgspec
from litestar import Controller, Request, get, post
from litestar.params import FromPath, URLEncodedBody
from litestar.response import Redirect, Template

from forge.core.errors import ForgeError, InvalidInput
from forge.http.pages.common import or_form_error, page
from forge.http.pages.forms import NO_ERRORS, form_errors
from webhooks import service
from webhooks.core.models import WebhookEndpoint
from webhooks.core.schemas import FailurePolicy, HookCreate, HookUpdate
from webhooks.http.hook_scope import HOOK_DEPENDENCIES, SIGN_IN_FIRST, HookScope, ScopeDep
from webhooks.sdk.protocol import NOTIFY_EVENTS, POLICY_EVENTS

Req = Request[Any, Any, Any]


class HookForm(msgspec.Struct, kw_only=True):
    url: str = ""
    kind: str = "notify"
    events: list[str] | str = msgspec.field(default_factory=list)
    failure_policy: str = "closed"
    active: str = ""
    csrf_token: str = ""

    def event_list(self) -> list[str]:
        return [self.events] if isinstance(self.events, str) else list(self.events)

    def chosen_events(self) -> list[str]:
        """The events ticked; none is refused here (the API's schema needs at least one)."""
        events = self.event_list()
        if not events:
            raise InvalidInput("choose at least one event", code="invalid_hook_events")
        return events


# The form's inputs, and the refusals (codes) that concern each.
INPUTS = ("url", "kind", "events", "failure_policy", "active")
ALIASES = {
    "invalid_hook_url": "url",
    "host_not_allowed": "url",
    "invalid_hook_events": "events",
    "invalid_failure_policy": "failure_policy",
}


def _failure_policy(value: str) -> FailurePolicy | None:
    if value == "open":
        return "open"
    if value == "hold":
        return "hold"
    return "closed" if value == "closed" else None


class _Pages:
    """Rendering and actions of one authorized scope."""

    def __init__(self, request: Req, scope: HookScope) -> None:
        self.request, self.scope = request, scope
        self.s, self.actor, self.cfg, self.repo = scope.session, scope.actor, scope.config, scope.repo
        self.base = scope.pages_base

    def _ctx(self) -> dict[str, Any]:
        return {
            "base": self.base,
            "scope_name": self.scope.name,
            "policy_events": POLICY_EVENTS,
            "notify_events": NOTIFY_EVENTS,
            "errors": NO_ERRORS,
        }

    async def list_page(self, status_code: int = 200, **context: Any) -> Template:
        endpoints = await service.list_endpoints(self.s, self.repo)
        return page(
            self.request,
            "webhooks/list.html",
            status_code=status_code,
            hooks=[self.scope.read(e) for e in endpoints],
            **{**self._ctx(), **context},
        )

    async def detail_page(self, endpoint: WebhookEndpoint, status_code: int = 200, **context: Any) -> Template:
        deliveries = await service.list_deliveries(self.s, endpoint, limit=50)
        return page(
            self.request,
            "webhooks/detail.html",
            status_code=status_code,
            hook=self.scope.read(endpoint),
            deliveries=deliveries,
            queued=self.request.query_params.get("queued", ""),
            **{**self._ctx(), **context},
        )

    async def create(self, form: HookForm) -> Template:
        async def add() -> tuple[WebhookEndpoint, str]:
            data = HookCreate(
                url=form.url.strip(),
                kind="policy" if form.kind == "policy" else "notify",
                events=form.chosen_events(),
                failure_policy=_failure_policy(form.failure_policy) or "closed",
                active=True,
            )
            return await service.create_endpoint(self.s, self.actor, self.cfg, self.repo, data)

        async def again(exc: ForgeError) -> Template:
            return await self.list_page(status_code=exc.status, errors=form_errors(exc, INPUTS, ALIASES), form=form)

        created = await or_form_error(add(), again, raise_404=False)
        if isinstance(created, Template):
            return created
        endpoint, secret = created
        return await self.detail_page(endpoint, created_secret=secret, created_kid=endpoint.secret_kid)

    async def edit(self, hook_id: int, form: HookForm) -> Template | Redirect:
        endpoint = await self.scope.endpoint(hook_id)

        async def update() -> WebhookEndpoint:
            data = HookUpdate(
                url=form.url.strip() or None,
                events=form.chosen_events(),
                failure_policy=_failure_policy(form.failure_policy),
                active=bool(form.active),
            )
            if endpoint.kind == "notify":
                data.failure_policy = None
            return await service.update_endpoint(self.s, self.actor, self.cfg, self.repo, endpoint, data)

        async def again(exc: ForgeError) -> Template:
            errors = form_errors(exc, INPUTS, ALIASES)
            return await self.detail_page(endpoint, status_code=exc.status, errors=errors, form=form)

        updated = await or_form_error(update(), again, raise_404=False)
        if isinstance(updated, Template):
            return updated
        if endpoint.active:
            self.scope.wake_after_commit()
        return Redirect(f"{self.base}/{hook_id}", status_code=303)

    async def rotate(self, hook_id: int, step: str) -> Template | Redirect:
        endpoint = await self.scope.endpoint(hook_id)
        cfg = self.cfg

        async def take_step() -> tuple[WebhookEndpoint, str, str] | None:
            """The new secret and its key id (`generate`); None for the other steps."""
            if step == "generate":
                return await service.rotate_generate(self.s, self.actor, cfg, self.repo, endpoint)
            if step == "promote":
                await service.rotate_promote(self.s, self.actor, cfg, self.repo, endpoint)
            else:
                await service.rotate_retire(self.s, self.actor, cfg, self.repo, endpoint)
            return None

        async def again(exc: ForgeError) -> Template:
            return await self.detail_page(endpoint, status_code=exc.status, errors=form_errors(exc, ()))

        rotated = await or_form_error(take_step(), again, raise_404=False)
        if isinstance(rotated, Template):
            return rotated
        if rotated is not None:
            generated, secret, kid = rotated
            return await self.detail_page(generated, created_secret=secret, created_kid=kid, rotated=True)
        return Redirect(f"{self.base}/{hook_id}", status_code=303)

    async def ping(self, hook_id: int) -> Redirect:
        endpoint = await self.scope.endpoint(hook_id)
        row = await service.ping(self.s, self.actor, self.cfg, self.repo, endpoint)
        self.scope.wake_after_commit()
        return Redirect(f"{self.base}/{hook_id}?queued={row.wid}", status_code=303)

    async def delete(self, hook_id: int) -> Redirect:
        endpoint = await self.scope.endpoint(hook_id)
        await service.delete_endpoint(self.s, self.actor, self.repo, endpoint)
        return Redirect(self.base, status_code=303)

    async def delivery_page(self, hook_id: int, delivery_id: int) -> Template:
        endpoint = await self.scope.endpoint(hook_id)
        detail = await service.get_delivery(self.s, endpoint, delivery_id)
        return page(
            self.request,
            "webhooks/delivery.html",
            hook=self.scope.read(endpoint),
            d=detail,
            **self._ctx(),
        )

    async def redeliver(self, hook_id: int, delivery_id: int) -> Redirect:
        endpoint = await self.scope.endpoint(hook_id)
        row = await service.redeliver(self.s, self.actor, self.cfg, self.repo, endpoint, delivery_id)
        self.scope.wake_after_commit()
        return Redirect(f"{self.base}/{hook_id}?queued={row.wid}", status_code=303)


class HookPages(Controller):
    """The pages of one scope; mounted by the two subclasses below, never on its own."""

    include_in_schema = False
    dependencies = HOOK_DEPENDENCIES
    opt = {SIGN_IN_FIRST: True}

    @get("/")
    async def index(self, request: Req, hook_scope: ScopeDep) -> Template:
        return await _Pages(request, hook_scope).list_page()

    @post("/")
    async def create(self, request: Req, hook_scope: ScopeDep, data: URLEncodedBody[HookForm]) -> Template:
        return await _Pages(request, hook_scope).create(data)

    @get("/{hook_id:int}")
    async def detail(self, request: Req, hook_scope: ScopeDep, hook_id: FromPath[int]) -> Template:
        return await _Pages(request, hook_scope).detail_page(await hook_scope.endpoint(hook_id))

    @post("/{hook_id:int}/edit")
    async def edit(
        self, request: Req, hook_scope: ScopeDep, hook_id: FromPath[int], data: URLEncodedBody[HookForm]
    ) -> Template | Redirect:
        return await _Pages(request, hook_scope).edit(hook_id, data)

    @post("/{hook_id:int}/rotate/{step:str}")
    async def rotate(
        self, request: Req, hook_scope: ScopeDep, hook_id: FromPath[int], step: FromPath[str]
    ) -> Template | Redirect:
        return await _Pages(request, hook_scope).rotate(hook_id, step)

    @post("/{hook_id:int}/ping")
    async def ping(self, request: Req, hook_scope: ScopeDep, hook_id: FromPath[int]) -> Redirect:
        return await _Pages(request, hook_scope).ping(hook_id)

    @post("/{hook_id:int}/delete")
    async def delete(self, request: Req, hook_scope: ScopeDep, hook_id: FromPath[int]) -> Redirect:
        return await _Pages(request, hook_scope).delete(hook_id)

    @get("/{hook_id:int}/deliveries/{delivery_id:int}")
    async def delivery(
        self, request: Req, hook_scope: ScopeDep, hook_id: FromPath[int], delivery_id: FromPath[int]
    ) -> Template:
        return await _Pages(request, hook_scope).delivery_page(hook_id, delivery_id)

    @post("/{hook_id:int}/deliveries/{delivery_id:int}/redeliver")
    async def redeliver(
        self, request: Req, hook_scope: ScopeDep, hook_id: FromPath[int], delivery_id: FromPath[int]
    ) -> Redirect:
        return await _Pages(request, hook_scope).redeliver(hook_id, delivery_id)


class InstanceHookPages(HookPages):
    path = "/admin/hooks"


class RepoHookPages(HookPages):
    path = "/{owner:str}/{name:str}/settings/hooks"
