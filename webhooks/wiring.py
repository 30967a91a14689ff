"""Composition of the package: `wire(bus, settings, db)` subscribes the outbox writer and builds
the deliverer and the policy dispatcher around one guarded connection pool."""

from typing import Any

from forge.core.urlguard import Resolver
from forge.db.allowlists import AllowListSource
from forge.db.engine import Database
from forge.db.events import AccountRef, EventBus
from forge.repos.merge_policy import MergeVerdict
from webhooks.core.config import WebhooksConfig
from webhooks.core.envelope import RepoRef, TaskMeta
from webhooks.core.outbound import Outbound
from webhooks.delivery.deliverer import Deliverer
from webhooks.delivery.outbox import OutboxWriter
from webhooks.policy.dispatcher import PolicyDispatcher


class PullMergePolicy:
    """forge's `MergePolicy` answered by the policy consumers: `pre_merge` with `meta.task` null,
    `meta.actor` the person merging and `data.pull_request` the pull request."""

    def __init__(self, dispatcher: PolicyDispatcher, db: Database) -> None:
        self.dispatcher = dispatcher
        self.db = db

    async def pre_merge(
        self, *, repo_id: int, repo_uuid: str, full_name: str, actor: AccountRef | None, merge: dict[str, Any]
    ) -> MergeVerdict:
        outcome = await self.dispatcher.dispatch(
            self.db,
            "pre_merge",
            repo=RepoRef(id=repo_id, uuid=repo_uuid, full_name=full_name),
            task_meta=TaskMeta(actor=actor),
            data=merge,
        )
        failure = outcome.failure_message
        if failure is not None:
            return MergeVerdict(allowed=False, reason=failure, failed=True)
        user = "\n".join(m for m in outcome.user_messages if m.strip())
        return MergeVerdict(allowed=outcome.decision == "allow", reason=user or outcome.reason)


class WebhooksRuntime:
    """What the host keeps on `app.state.webhooks`: `policy` (the dispatcher tasks call),
    `deliverer`, `config`, and `start()`/`stop()` for the delivery loop."""

    def __init__(
        self,
        db: Database,
        config: WebhooksConfig,
        *,
        resolver: Resolver | None = None,
        deliver: bool = True,
    ) -> None:
        self.db = db
        self.config = config
        self.deliver = deliver
        # Every new connection checks the allow-list as it is now (the floor and an admin's hosts).
        allow = AllowListSource(db, "webhooks", config.allow)
        self.policy_outbound = Outbound(allow, max_connections=config.policy_concurrency, resolver=resolver)
        self.delivery_outbound = Outbound(allow, max_connections=config.delivery_concurrency, resolver=resolver)
        self.policy = PolicyDispatcher(db, config, self.policy_outbound)
        self.merge_policy = PullMergePolicy(self.policy, db)
        self.deliverer = Deliverer(db, config, self.delivery_outbound)
        self.writer = OutboxWriter(config, wake=self.deliverer.wake)

    def wake(self) -> None:
        self.deliverer.wake()

    async def start(self) -> None:
        """Start the delivery loop (unless built with `deliver=False`)."""
        if self.deliver:
            await self.deliverer.start()

    async def stop(self) -> None:
        await self.deliverer.stop()
        await self.policy.aclose()
        await self.policy_outbound.aclose()
        await self.delivery_outbound.aclose()


def wire(bus: EventBus, settings: Any, db: Database, **options: Any) -> WebhooksRuntime:
    """Subscribe the outbox writer to `bus` and return the runtime (not started).

    `options`: `resolver` (tests), `deliver` (run the delivery loop in `start()`, default from
    `settings.webhooks_deliver`, true), and any `WebhooksConfig` field (`allow`, `clock`...)."""
    resolver = options.pop("resolver", None)
    deliver = bool(options.pop("deliver", getattr(settings, "webhooks_deliver", True)))
    config = WebhooksConfig.from_settings(settings, **options)
    runtime = WebhooksRuntime(db, config, resolver=resolver, deliver=deliver)
    bus.subscribe(runtime.writer)
    return runtime
