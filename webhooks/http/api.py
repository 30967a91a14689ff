"""REST: webhook endpoints of the instance (`/api/v1/admin/hooks`, instance admins) and of a
repository (`/api/v1/repos/{owner}/{name}/hooks`, repository admins; tokens need
`webhooks:admin`). One set of handlers serves both: the `hook_scope` dependency resolves and
authorizes the scope (`webhooks.http.hook_scope`). Secrets appear only in the answers of create and rotate."""

from typing import Annotated

from litestar import Controller, delete, get, patch, post
from litestar.params import FromPath, JSONBody, Parameter

from forge.http.auth import signed_in
from webhooks import service
from webhooks.core.models import WebhookOutbox
from webhooks.core.schemas import DeliveryDetail, DeliveryRead, HookCreate, HookRead, HookUpdate, HookWithSecret, Queued
from webhooks.http.hook_scope import HOOK_DEPENDENCIES, ScopeDep

Limit = Annotated[int, Parameter(ge=1, le=200)]
Before = Annotated[int | None, Parameter(ge=1)]


def _queued(row: WebhookOutbox) -> Queued:
    return Queued(delivery_id=row.wid, outbox_id=row.id, event=row.event_type)


class HooksController(Controller):
    """The handlers of one scope; mounted by the two subclasses below, never on its own."""

    tags = ["webhooks"]
    dependencies = HOOK_DEPENDENCIES

    @get("/", summary="The scope's webhook endpoints")
    async def list_hooks(self, hook_scope: ScopeDep) -> list[HookRead]:
        return [hook_scope.read(e) for e in await service.list_endpoints(hook_scope.session, hook_scope.repo)]

    @post("/", summary="Create an endpoint (its secret is in this answer only)")
    async def create_hook(self, hook_scope: ScopeDep, data: JSONBody[HookCreate]) -> HookWithSecret:
        s = hook_scope
        endpoint, secret = await service.create_endpoint(s.session, s.actor, s.config, s.repo, data)
        return HookWithSecret(hook=s.read(endpoint), secret=secret, kid=endpoint.secret_kid)

    @get("/{hook_id:int}", summary="One endpoint")
    async def get_hook(self, hook_scope: ScopeDep, hook_id: FromPath[int]) -> HookRead:
        return hook_scope.read(await hook_scope.endpoint(hook_id))

    @patch("/{hook_id:int}", summary="Change an endpoint (active=true re-enables a disabled one)")
    async def update_hook(self, hook_scope: ScopeDep, hook_id: FromPath[int], data: JSONBody[HookUpdate]) -> HookRead:
        s = hook_scope
        endpoint = await service.update_endpoint(s.session, s.actor, s.config, s.repo, await s.endpoint(hook_id), data)
        if endpoint.active:
            s.wake_after_commit()  # pending rows of a re-enabled endpoint go now
        return s.read(endpoint)

    @delete("/{hook_id:int}", summary="Delete an endpoint (pending notifications go with it)")
    async def delete_hook(self, hook_scope: ScopeDep, hook_id: FromPath[int]) -> None:
        s = hook_scope
        await service.delete_endpoint(s.session, s.actor, s.repo, await s.endpoint(hook_id))

    @post("/{hook_id:int}/ping", summary="Queue a ping", status_code=202)
    async def ping_hook(self, hook_scope: ScopeDep, hook_id: FromPath[int]) -> Queued:
        s = hook_scope
        row = await service.ping(s.session, s.actor, s.config, s.repo, await s.endpoint(hook_id))
        s.wake_after_commit()
        return _queued(row)

    @post("/{hook_id:int}/rotate", summary="Stage a next secret (answered once)", status_code=200)
    async def rotate_hook(self, hook_scope: ScopeDep, hook_id: FromPath[int]) -> HookWithSecret:
        s = hook_scope
        endpoint = await s.endpoint(hook_id)
        endpoint, secret, kid = await service.rotate_generate(s.session, s.actor, s.config, s.repo, endpoint)
        return HookWithSecret(hook=s.read(endpoint), secret=secret, kid=kid)

    @post("/{hook_id:int}/rotate/promote", summary="Sign with the next secret from now on", status_code=200)
    async def promote_secret(self, hook_scope: ScopeDep, hook_id: FromPath[int]) -> HookRead:
        s = hook_scope
        return s.read(await service.rotate_promote(s.session, s.actor, s.config, s.repo, await s.endpoint(hook_id)))

    @post("/{hook_id:int}/rotate/retire", summary="Forget the second secret", status_code=200)
    async def retire_secret(self, hook_scope: ScopeDep, hook_id: FromPath[int]) -> HookRead:
        s = hook_scope
        return s.read(await service.rotate_retire(s.session, s.actor, s.config, s.repo, await s.endpoint(hook_id)))

    @get("/{hook_id:int}/deliveries", summary="The endpoint's delivery log, newest first")
    async def list_deliveries(
        self, hook_scope: ScopeDep, hook_id: FromPath[int], limit: Limit = 50, before: Before = None
    ) -> list[DeliveryRead]:
        endpoint = await hook_scope.endpoint(hook_id)
        return await service.list_deliveries(hook_scope.session, endpoint, limit=limit, before=before)

    @get("/{hook_id:int}/deliveries/{delivery_id:int}", summary="One attempt: request and response")
    async def get_delivery(
        self, hook_scope: ScopeDep, hook_id: FromPath[int], delivery_id: FromPath[int]
    ) -> DeliveryDetail:
        return await service.get_delivery(hook_scope.session, await hook_scope.endpoint(hook_id), delivery_id)

    @post(
        "/{hook_id:int}/deliveries/{delivery_id:int}/redeliver",
        summary="Queue a new attempt (same body and webhook-id)",
        status_code=202,
    )
    async def redeliver(self, hook_scope: ScopeDep, hook_id: FromPath[int], delivery_id: FromPath[int]) -> Queued:
        s = hook_scope
        endpoint = await s.endpoint(hook_id)
        row = await service.redeliver(s.session, s.actor, s.config, s.repo, endpoint, delivery_id)
        s.wake_after_commit()
        return _queued(row)


class InstanceHooksController(HooksController):
    path = "/api/v1/admin/hooks"
    guards = [signed_in]


class RepoHooksController(HooksController):
    path = "/api/v1/repos/{owner:str}/{name:str}/hooks"
