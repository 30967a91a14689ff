"""REST: webhook endpoints of the instance (`/api/v1/admin/hooks`, instance admins) and of a
repository (`/api/v1/repos/{owner}/{name}/hooks`, repository admins; tokens need
`webhooks:admin`). Secrets appear only in the answers of create and rotate."""

from typing import Annotated

from litestar import Controller, delete, get, patch, post
from litestar.datastructures import State
from litestar.di import NamedDependency, Provide
from litestar.params import FromPath, JSONBody, Parameter
from sqlalchemy.ext.asyncio import AsyncSession

from forge.access import INSTANCE, Action, require
from forge.audit import Actor
from forge.auth import signed_in
from forge.deps import ActorDep, DbSession
from forge.errors import Unavailable
from forge.models import Repository
from webhooks import service
from webhooks.models import WebhookOutbox
from webhooks.outbox import wake_after_commit
from webhooks.repo_access import repo_for_hooks_admin
from webhooks.runtime import WebhooksRuntime
from webhooks.schemas import DeliveryDetail, DeliveryRead, HookCreate, HookRead, HookUpdate, HookWithSecret, Queued


def provide_runtime(state: State) -> WebhooksRuntime:
    runtime = getattr(state, "webhooks", None)
    if not isinstance(runtime, WebhooksRuntime):
        raise Unavailable("webhooks are not set up on this server", code="webhooks_unavailable")
    return runtime


RuntimeDep = NamedDependency[WebhooksRuntime]
HOOK_DEPENDENCIES = {"webhooks_runtime": Provide(provide_runtime, sync_to_thread=False)}
Limit = Annotated[int, Parameter(ge=1, le=200)]
Before = Annotated[int | None, Parameter(ge=1)]


def _queued(row: WebhookOutbox) -> Queued:
    return Queued(delivery_id=row.wid, outbox_id=row.id, event=row.event_type)


class _Ops:
    """The operations both scopes share, once the scope (repository or instance) is authorized."""

    def __init__(self, session: AsyncSession, actor: Actor, runtime: WebhooksRuntime, repo: Repository | None):
        self.s, self.actor, self.rt, self.repo = session, actor, runtime, repo

    async def all(self) -> list[HookRead]:
        return [service.to_read(e, self.repo) for e in await service.list_endpoints(self.s, self.repo)]

    async def create(self, data: HookCreate) -> HookWithSecret:
        endpoint, secret = await service.create_endpoint(self.s, self.actor, self.rt.config, self.repo, data)
        return HookWithSecret(hook=service.to_read(endpoint, self.repo), secret=secret, kid=endpoint.secret_kid)

    async def get(self, hook_id: int) -> HookRead:
        return service.to_read(await service.get_endpoint(self.s, self.repo, hook_id), self.repo)

    async def update(self, hook_id: int, data: HookUpdate) -> HookRead:
        endpoint = await service.get_endpoint(self.s, self.repo, hook_id)
        endpoint = await service.update_endpoint(self.s, self.actor, self.rt.config, self.repo, endpoint, data)
        if endpoint.active:
            wake_after_commit(self.s, self.rt.wake)  # pending rows of a re-enabled endpoint go now
        return service.to_read(endpoint, self.repo)

    async def delete(self, hook_id: int) -> None:
        endpoint = await service.get_endpoint(self.s, self.repo, hook_id)
        await service.delete_endpoint(self.s, self.actor, self.repo, endpoint)

    async def ping(self, hook_id: int) -> Queued:
        endpoint = await service.get_endpoint(self.s, self.repo, hook_id)
        row = await service.ping(self.s, self.actor, self.rt.config, self.repo, endpoint)
        wake_after_commit(self.s, self.rt.wake)
        return _queued(row)

    async def rotate(self, hook_id: int) -> HookWithSecret:
        endpoint = await service.get_endpoint(self.s, self.repo, hook_id)
        endpoint, secret, kid = await service.rotate_generate(self.s, self.actor, self.rt.config, self.repo, endpoint)
        return HookWithSecret(hook=service.to_read(endpoint, self.repo), secret=secret, kid=kid)

    async def promote(self, hook_id: int) -> HookRead:
        endpoint = await service.get_endpoint(self.s, self.repo, hook_id)
        endpoint = await service.rotate_promote(self.s, self.actor, self.rt.config, self.repo, endpoint)
        return service.to_read(endpoint, self.repo)

    async def retire(self, hook_id: int) -> HookRead:
        endpoint = await service.get_endpoint(self.s, self.repo, hook_id)
        endpoint = await service.rotate_retire(self.s, self.actor, self.rt.config, self.repo, endpoint)
        return service.to_read(endpoint, self.repo)

    async def deliveries(self, hook_id: int, limit: int, before: int | None) -> list[DeliveryRead]:
        endpoint = await service.get_endpoint(self.s, self.repo, hook_id)
        return await service.list_deliveries(self.s, endpoint, limit=limit, before=before)

    async def delivery(self, hook_id: int, delivery_id: int) -> DeliveryDetail:
        endpoint = await service.get_endpoint(self.s, self.repo, hook_id)
        return await service.get_delivery(self.s, endpoint, delivery_id)

    async def redeliver(self, hook_id: int, delivery_id: int) -> Queued:
        endpoint = await service.get_endpoint(self.s, self.repo, hook_id)
        row = await service.redeliver(self.s, self.actor, self.rt.config, self.repo, endpoint, delivery_id)
        wake_after_commit(self.s, self.rt.wake)
        return _queued(row)


async def _repo_ops(session: AsyncSession, actor: Actor, runtime: WebhooksRuntime, owner: str, name: str) -> _Ops:
    repo = await repo_for_hooks_admin(session, actor.principal, owner, name)
    return _Ops(session, actor, runtime, repo)


def _instance_ops(session: AsyncSession, actor: Actor, runtime: WebhooksRuntime) -> _Ops:
    require(actor.principal, Action.INSTANCE_ADMIN, INSTANCE)
    return _Ops(session, actor, runtime, None)


class RepoHooksController(Controller):
    path = "/api/v1/repos/{owner:str}/{name:str}/hooks"
    tags = ["webhooks"]
    dependencies = HOOK_DEPENDENCIES

    @get("/", summary="A repository's webhook endpoints")
    async def list_hooks(
        self,
        db_session: DbSession,
        actor: ActorDep,
        webhooks_runtime: RuntimeDep,
        owner: FromPath[str],
        name: FromPath[str],
    ) -> list[HookRead]:
        return await (await _repo_ops(db_session, actor, webhooks_runtime, owner, name)).all()

    @post("/", summary="Create an endpoint (its secret is in this answer only)")
    async def create_hook(
        self,
        db_session: DbSession,
        actor: ActorDep,
        webhooks_runtime: RuntimeDep,
        owner: FromPath[str],
        name: FromPath[str],
        data: JSONBody[HookCreate],
    ) -> HookWithSecret:
        return await (await _repo_ops(db_session, actor, webhooks_runtime, owner, name)).create(data)

    @get("/{hook_id:int}", summary="One endpoint")
    async def get_hook(
        self,
        db_session: DbSession,
        actor: ActorDep,
        webhooks_runtime: RuntimeDep,
        owner: FromPath[str],
        name: FromPath[str],
        hook_id: FromPath[int],
    ) -> HookRead:
        return await (await _repo_ops(db_session, actor, webhooks_runtime, owner, name)).get(hook_id)

    @patch("/{hook_id:int}", summary="Change an endpoint (active=true re-enables a disabled one)")
    async def update_hook(
        self,
        db_session: DbSession,
        actor: ActorDep,
        webhooks_runtime: RuntimeDep,
        owner: FromPath[str],
        name: FromPath[str],
        hook_id: FromPath[int],
        data: JSONBody[HookUpdate],
    ) -> HookRead:
        return await (await _repo_ops(db_session, actor, webhooks_runtime, owner, name)).update(hook_id, data)

    @delete("/{hook_id:int}", summary="Delete an endpoint (pending notifications go with it)")
    async def delete_hook(
        self,
        db_session: DbSession,
        actor: ActorDep,
        webhooks_runtime: RuntimeDep,
        owner: FromPath[str],
        name: FromPath[str],
        hook_id: FromPath[int],
    ) -> None:
        await (await _repo_ops(db_session, actor, webhooks_runtime, owner, name)).delete(hook_id)

    @post("/{hook_id:int}/ping", summary="Queue a ping", status_code=202)
    async def ping_hook(
        self,
        db_session: DbSession,
        actor: ActorDep,
        webhooks_runtime: RuntimeDep,
        owner: FromPath[str],
        name: FromPath[str],
        hook_id: FromPath[int],
    ) -> Queued:
        return await (await _repo_ops(db_session, actor, webhooks_runtime, owner, name)).ping(hook_id)

    @post("/{hook_id:int}/rotate", summary="Stage a next secret (answered once)", status_code=200)
    async def rotate_hook(
        self,
        db_session: DbSession,
        actor: ActorDep,
        webhooks_runtime: RuntimeDep,
        owner: FromPath[str],
        name: FromPath[str],
        hook_id: FromPath[int],
    ) -> HookWithSecret:
        return await (await _repo_ops(db_session, actor, webhooks_runtime, owner, name)).rotate(hook_id)

    @post("/{hook_id:int}/rotate/promote", summary="Sign with the next secret from now on", status_code=200)
    async def promote_secret(
        self,
        db_session: DbSession,
        actor: ActorDep,
        webhooks_runtime: RuntimeDep,
        owner: FromPath[str],
        name: FromPath[str],
        hook_id: FromPath[int],
    ) -> HookRead:
        return await (await _repo_ops(db_session, actor, webhooks_runtime, owner, name)).promote(hook_id)

    @post("/{hook_id:int}/rotate/retire", summary="Forget the second secret", status_code=200)
    async def retire_secret(
        self,
        db_session: DbSession,
        actor: ActorDep,
        webhooks_runtime: RuntimeDep,
        owner: FromPath[str],
        name: FromPath[str],
        hook_id: FromPath[int],
    ) -> HookRead:
        return await (await _repo_ops(db_session, actor, webhooks_runtime, owner, name)).retire(hook_id)

    @get("/{hook_id:int}/deliveries", summary="The endpoint's delivery log, newest first")
    async def list_deliveries(
        self,
        db_session: DbSession,
        actor: ActorDep,
        webhooks_runtime: RuntimeDep,
        owner: FromPath[str],
        name: FromPath[str],
        hook_id: FromPath[int],
        limit: Limit = 50,
        before: Before = None,
    ) -> list[DeliveryRead]:
        ops = await _repo_ops(db_session, actor, webhooks_runtime, owner, name)
        return await ops.deliveries(hook_id, limit, before)

    @get("/{hook_id:int}/deliveries/{delivery_id:int}", summary="One attempt: request and response")
    async def get_delivery(
        self,
        db_session: DbSession,
        actor: ActorDep,
        webhooks_runtime: RuntimeDep,
        owner: FromPath[str],
        name: FromPath[str],
        hook_id: FromPath[int],
        delivery_id: FromPath[int],
    ) -> DeliveryDetail:
        ops = await _repo_ops(db_session, actor, webhooks_runtime, owner, name)
        return await ops.delivery(hook_id, delivery_id)

    @post(
        "/{hook_id:int}/deliveries/{delivery_id:int}/redeliver",
        summary="Queue a new attempt (same body and webhook-id)",
        status_code=202,
    )
    async def redeliver(
        self,
        db_session: DbSession,
        actor: ActorDep,
        webhooks_runtime: RuntimeDep,
        owner: FromPath[str],
        name: FromPath[str],
        hook_id: FromPath[int],
        delivery_id: FromPath[int],
    ) -> Queued:
        ops = await _repo_ops(db_session, actor, webhooks_runtime, owner, name)
        return await ops.redeliver(hook_id, delivery_id)


class InstanceHooksController(Controller):
    path = "/api/v1/admin/hooks"
    guards = [signed_in]
    tags = ["webhooks"]
    dependencies = HOOK_DEPENDENCIES

    @get("/", summary="Instance webhook endpoints")
    async def list_hooks(self, db_session: DbSession, actor: ActorDep, webhooks_runtime: RuntimeDep) -> list[HookRead]:
        return await _instance_ops(db_session, actor, webhooks_runtime).all()

    @post("/", summary="Create an instance endpoint (its secret is in this answer only)")
    async def create_hook(
        self, db_session: DbSession, actor: ActorDep, webhooks_runtime: RuntimeDep, data: JSONBody[HookCreate]
    ) -> HookWithSecret:
        return await _instance_ops(db_session, actor, webhooks_runtime).create(data)

    @get("/{hook_id:int}", summary="One instance endpoint")
    async def get_hook(
        self, db_session: DbSession, actor: ActorDep, webhooks_runtime: RuntimeDep, hook_id: FromPath[int]
    ) -> HookRead:
        return await _instance_ops(db_session, actor, webhooks_runtime).get(hook_id)

    @patch("/{hook_id:int}", summary="Change an instance endpoint")
    async def update_hook(
        self,
        db_session: DbSession,
        actor: ActorDep,
        webhooks_runtime: RuntimeDep,
        hook_id: FromPath[int],
        data: JSONBody[HookUpdate],
    ) -> HookRead:
        return await _instance_ops(db_session, actor, webhooks_runtime).update(hook_id, data)

    @delete("/{hook_id:int}", summary="Delete an instance endpoint")
    async def delete_hook(
        self, db_session: DbSession, actor: ActorDep, webhooks_runtime: RuntimeDep, hook_id: FromPath[int]
    ) -> None:
        await _instance_ops(db_session, actor, webhooks_runtime).delete(hook_id)

    @post("/{hook_id:int}/ping", summary="Queue a ping", status_code=202)
    async def ping_hook(
        self, db_session: DbSession, actor: ActorDep, webhooks_runtime: RuntimeDep, hook_id: FromPath[int]
    ) -> Queued:
        return await _instance_ops(db_session, actor, webhooks_runtime).ping(hook_id)

    @post("/{hook_id:int}/rotate", summary="Stage a next secret (answered once)", status_code=200)
    async def rotate_hook(
        self, db_session: DbSession, actor: ActorDep, webhooks_runtime: RuntimeDep, hook_id: FromPath[int]
    ) -> HookWithSecret:
        return await _instance_ops(db_session, actor, webhooks_runtime).rotate(hook_id)

    @post("/{hook_id:int}/rotate/promote", summary="Sign with the next secret from now on", status_code=200)
    async def promote_secret(
        self, db_session: DbSession, actor: ActorDep, webhooks_runtime: RuntimeDep, hook_id: FromPath[int]
    ) -> HookRead:
        return await _instance_ops(db_session, actor, webhooks_runtime).promote(hook_id)

    @post("/{hook_id:int}/rotate/retire", summary="Forget the second secret", status_code=200)
    async def retire_secret(
        self, db_session: DbSession, actor: ActorDep, webhooks_runtime: RuntimeDep, hook_id: FromPath[int]
    ) -> HookRead:
        return await _instance_ops(db_session, actor, webhooks_runtime).retire(hook_id)

    @get("/{hook_id:int}/deliveries", summary="The endpoint's delivery log, newest first")
    async def list_deliveries(
        self,
        db_session: DbSession,
        actor: ActorDep,
        webhooks_runtime: RuntimeDep,
        hook_id: FromPath[int],
        limit: Limit = 50,
        before: Before = None,
    ) -> list[DeliveryRead]:
        return await _instance_ops(db_session, actor, webhooks_runtime).deliveries(hook_id, limit, before)

    @get("/{hook_id:int}/deliveries/{delivery_id:int}", summary="One attempt: request and response")
    async def get_delivery(
        self,
        db_session: DbSession,
        actor: ActorDep,
        webhooks_runtime: RuntimeDep,
        hook_id: FromPath[int],
        delivery_id: FromPath[int],
    ) -> DeliveryDetail:
        return await _instance_ops(db_session, actor, webhooks_runtime).delivery(hook_id, delivery_id)

    @post(
        "/{hook_id:int}/deliveries/{delivery_id:int}/redeliver",
        summary="Queue a new attempt (same body and webhook-id)",
        status_code=202,
    )
    async def redeliver(
        self,
        db_session: DbSession,
        actor: ActorDep,
        webhooks_runtime: RuntimeDep,
        hook_id: FromPath[int],
        delivery_id: FromPath[int],
    ) -> Queued:
        return await _instance_ops(db_session, actor, webhooks_runtime).redeliver(hook_id, delivery_id)
