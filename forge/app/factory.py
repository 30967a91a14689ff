"""The composition root: builds the Litestar app from settings. The only module (with cli.py)
that knows every package."""

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from litestar import Litestar, MediaType, Response, get
from litestar.config.compression import CompressionConfig
from litestar.datastructures import State
from litestar.middleware.base import DefineMiddleware
from litestar.openapi import OpenAPIConfig
from litestar.plugins.jinja import JinjaTemplateEngine
from litestar.plugins.prometheus import PrometheusConfig, PrometheusController
from litestar.response import File
from litestar.static_files import create_static_files_router
from litestar.template.config import TemplateConfig
from litestar.types import ControllerRouterHandler
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from forge.accounts.tokens import TokenCache
from forge.core.access import Principal, Scope
from forge.core.error_codes import Code
from forge.core.logging import configure_logging
from forge.core.settings import Settings
from forge.core.text import plural
from forge.core.version import VERSION
from forge.db.engine import Database
from forge.db.events import EventBus
from forge.git import RepoStore, install_hooks
from forge.git.journal import PushJournal
from forge.git.smart_http import GitHttpConfig
from forge.http.api.admin import AdminController
from forge.http.api.contract import ContractJsonPlugin
from forge.http.api.issues import IssueCommentController, IssueController, LabelController, MilestoneController
from forge.http.api.notifications import NotificationController, SubscriptionController
from forge.http.api.pulls import PendingReviewController, PullController, SuggestionController, ThreadController
from forge.http.api.reference import API_DESCRIPTION, API_REFERENCE_ASSETS, SCHEMA_PATH, LocalSwaggerPlugin
from forge.http.api.repos import BrowseController, RepoController
from forge.http.api.secrets import RepoSecretController
from forge.http.api.statuses import StatusController
from forge.http.api.user import UserController
from forge.http.auth import AuthenticationLayer, AuthState
from forge.http.deps import DEPENDENCIES
from forge.http.edges import add_security_headers, before_request
from forge.http.git_http import GIT_ROUTES
from forge.http.pages.account import OldSettingsPages, ProfilePages, SettingsPages
from forge.http.pages.admin import AdminPages
from forge.http.pages.admin_network import NetworkPages
from forge.http.pages.browse import RepoPages
from forge.http.pages.home import HomePages
from forge.http.pages.issues import IssuePages
from forge.http.pages.labels import LabelPages
from forge.http.pages.model_keys import ModelKeyPages
from forge.http.pages.notifications import NotificationPages, NotificationSettingsPages, WatchPages
from forge.http.pages.pulls import PullPages
from forge.http.pages.repo_settings import RepoSettingsPages
from forge.http.pages.repos import RepoListPages
from forge.http.pages.signin import AuthPages
from forge.http.pages.tokens import TokenPages
from forge.http.problems import EXCEPTION_HANDLERS, audit_refusal
from forge.notify.notifier import Notifications
from forge.repos.pushes import PushRecorder
from tasks.http.pull_work_api import TaskWorkForPulls
from tasks.http.routes import API_HANDLERS as TASK_API_HANDLERS
from tasks.http.routes import PAGE_HANDLERS as TASK_PAGE_HANDLERS
from tasks.run.webhook_gate import WebhookGate
from tasks.services.agent_triggers import AgentTriggers
from tasks.services.task_people import task_people
from tasks.services.workers import health as worker_health
from tasks.system import TaskSystem
from webhooks.http import ROUTE_HANDLERS as WEBHOOK_HANDLERS
from webhooks.sdk.protocol import NOTIFY_EVENTS, POLICY_EVENTS
from webhooks.wiring import WebhooksRuntime
from webhooks.wiring import wire as wire_webhooks

HERE = Path(__file__).parent.parent  # forge/: its templates and static files
_HOOK_EVENTS = (*POLICY_EVENTS, *NOTIFY_EVENTS)
# The closed vocabularies of request bodies, as enums in the OpenAPI document (component.field).
_API_ENUMS = {
    "TokenCreate.scopes": [s.value for s in Scope],
    "HookCreate.events": _HOOK_EVENTS,
    "HookUpdate.events": _HOOK_EVENTS,
}


def _template_filters(engine: JinjaTemplateEngine) -> None:
    """What every template may use besides Jinja's own: `n|plural("commit")` (1 commit, 2 commits)."""
    engine.engine.filters["plural"] = plural


@get("/healthz", include_in_schema=False, media_type=MediaType.JSON)
async def healthz(state: State) -> Response[dict[str, Any]]:
    """200 while the database answers (503 otherwise), with the task workers in short: `status` is
    `degraded` when a live worker's Docker engine does not answer (it claims nothing meanwhile).
    The web replica itself still serves, so a load balancer keeps it (docs/operator.md)."""
    db: Database = state.db
    try:
        async with db.session() as session:
            await session.execute(text("select 1"))
            workers_ok, workers = await worker_health(session, state.settings)
    except Exception:
        return Response({"status": "unhealthy", "database": "unreachable"}, status_code=503)
    return Response({"status": "ok" if workers_ok else "degraded", "version": VERSION, "workers": workers})


@get("/favicon.ico", include_in_schema=False, name="favicon")
async def favicon() -> File:
    # Pages link /static/favicon.svg; a browser showing a document with no link of its own (the
    # JSON of /api/schema/openapi.json, a raw file) asks here, and a 404 would be a console error.
    return File(path=HERE / "static" / "favicon.svg", media_type="image/svg+xml", content_disposition_type="inline")


class MetricsController(PrometheusController):
    path = "/metrics"
    include_in_schema = False


@dataclass(frozen=True)
class Parts:
    """What one app is built from: the database, the event bus, the repositories on disk and the
    systems that subscribe to the bus (webhooks, tasks, the push recorder, notifications)."""

    settings: Settings
    database: Database
    bus: EventBus
    store: RepoStore
    git_config: GitHttpConfig
    hooks: WebhooksRuntime
    task_system: TaskSystem
    push_recorder: PushRecorder
    notifications: Notifications


def wire(settings: Settings, database: Database) -> Parts:
    bus = EventBus()
    store = RepoStore(settings.data_dir / "repos")
    git_config = GitHttpConfig(
        # Server-owned hooks outside every repository: nothing a push carries can change them.
        hooks_dir=install_hooks(settings.data_dir / "git-hooks"),
        max_request_bytes=settings.max_push_bytes,
    )
    # The webhooks outbox subscribes to the bus: every published event becomes outbox rows in
    # the transaction of the change; the deliverer sends them. Its policy dispatcher is the gate
    # the task core asks before guarded actions.
    hooks = wire_webhooks(bus, settings, database)
    # Notifications subscribe too: inbox threads and e-mail outbox rows in the change's transaction.
    notifications = Notifications(database, settings, tasks=task_people)
    bus.subscribe(notifications.notifier)
    task_system = TaskSystem(database, settings, store, bus, gate=WebhookGate(hooks.policy, database))
    push_recorder = PushRecorder(
        database,
        bus,
        PushJournal(settings.data_dir / "push-journal"),
        store.root,
        store=store,
        base_url=settings.effective_base_url,
    )
    return Parts(settings, database, bus, store, git_config, hooks, task_system, push_recorder, notifications)


def lifespan_of(parts: Parts, *, owns_database: bool) -> Callable[[Litestar], AbstractAsyncContextManager[None]]:
    """Start what runs beside requests, and stop it (the database too, when the app made it)."""

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        await parts.push_recorder.start()  # records what a crash left in the push journal
        await parts.task_system.start_wakeups()  # other processes' changes wake live views (PostgreSQL)
        await parts.task_system.start_recovery()  # finishes or drops merges a crash interrupted
        if parts.settings.run_worker:
            await parts.task_system.start_worker()
            await parts.hooks.start()
            await parts.notifications.start()  # the mailer (when SMTP is configured)
        try:
            yield
        finally:
            await parts.notifications.stop()
            await parts.hooks.stop()
            await parts.task_system.stop_worker()
            await parts.task_system.stop_recovery()
            await parts.task_system.stop_wakeups()
            await parts.push_recorder.stop()
            await parts.store.close()
            if owns_database:
                await parts.database.dispose()

    return lifespan


def app_state(parts: Parts) -> dict[str, Any]:
    """`app.state`: what dependencies and middleware find (forge.http.deps)."""
    task_system = parts.task_system

    async def account_tasks(session: AsyncSession, principal: Principal) -> list[Any]:
        svc = task_system.service(session)
        return list(await svc.to_reads(await svc.list_for_user(principal, limit=20)))

    return {
        "settings": parts.settings,
        "db": parts.database,
        "auth": AuthState(parts.database, TokenCache(parts.settings.token_cache_seconds)),
        "bus": parts.bus,
        "repo_store": parts.store,
        "git_config": parts.git_config,
        "push_recorder": parts.push_recorder,
        "tasks": task_system,
        "webhooks": parts.hooks,
        "notifications": parts.notifications,
        # Every merge of a pull request asks the repository's policy consumers (`pre_merge`).
        "merge_policy": parts.hooks.merge_policy,
        # A task's pull request reviewed or merged over the API goes through its task.
        "task_work": TaskWorkForPulls(parts.task_system),
        # A bot assigned to an issue or mentioned in a comment starts a task (forge's AgentWork).
        "agent_work": AgentTriggers(parts.task_system.service),
        "account_tasks": account_tasks,  # the profile page's "your tasks" (forge/http/pages/account.py)
    }


def route_handlers() -> list[ControllerRouterHandler]:
    """Every route, in the order Litestar matches them."""
    return [
        healthz,
        favicon,
        MetricsController,
        UserController,
        NotificationController,
        AdminController,
        RepoController,
        BrowseController,
        StatusController,
        RepoSecretController,
        PullController,
        IssueController,
        IssueCommentController,
        LabelController,
        MilestoneController,
        SuggestionController,
        ThreadController,
        PendingReviewController,
        SubscriptionController,
        *TASK_API_HANDLERS,
        *WEBHOOK_HANDLERS,
        *TASK_PAGE_HANDLERS,
        *GIT_ROUTES,
        AuthPages,
        HomePages,
        TokenPages,
        ModelKeyPages,
        AdminPages,
        NetworkPages,
        RepoListPages,
        RepoPages,
        PullPages,
        IssuePages,
        LabelPages,
        RepoSettingsPages,
        WatchPages,
        NotificationPages,
        NotificationSettingsPages,
        SettingsPages,
        OldSettingsPages,
        ProfilePages,  # `/{login}`: one segment, after every static one-segment route above
        create_static_files_router(path="/static", directories=[HERE / "static"], include_in_schema=False),
        API_REFERENCE_ASSETS,
    ]


def openapi_config() -> OpenAPIConfig:
    return OpenAPIConfig(
        title="forgehand",
        version=VERSION,
        description=API_DESCRIPTION,
        path=SCHEMA_PATH,
        # The API reference is served from this instance (assets included): no request leaves it.
        render_plugins=[
            LocalSwaggerPlugin(),
            ContractJsonPlugin(enums=_API_ENUMS, codes=[c.value for c in Code]),
        ],
    )


def create_app(settings: Settings, *, db: Database | None = None) -> Litestar:
    """Build the app. `settings` must already be prepared (see `settings.prepare_data_dir`)."""
    configure_logging(settings.log_format, settings.log_level)
    parts = wire(settings, db or Database(settings.effective_database_url))
    prometheus = PrometheusConfig(app_name="forgehand", prefix="forgehand", group_path=True, exclude=["/metrics"])
    return Litestar(
        route_handlers=route_handlers(),
        dependencies=DEPENDENCIES,
        middleware=[
            prometheus.middleware,
            DefineMiddleware(AuthenticationLayer, exclude=["^/static/", "^/healthz$", "^/metrics$", "^/favicon.ico$"]),
        ],
        before_request=before_request,
        before_send=[add_security_headers],
        after_exception=[audit_refusal],
        exception_handlers=EXCEPTION_HANDLERS,
        template_config=TemplateConfig(
            directory=HERE / "templates", engine=JinjaTemplateEngine, engine_callback=_template_filters
        ),
        openapi_config=openapi_config(),
        # Git routes (opt "git") stream packs that are compressed already.
        compression_config=CompressionConfig(backend="gzip", minimum_size=1024, exclude_opt_key="git"),
        request_max_body_size=settings.max_body_bytes,
        state=State(app_state(parts)),
        lifespan=[lifespan_of(parts, owns_database=db is None)],
        debug=False,
    )
