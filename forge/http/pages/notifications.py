"""Notification pages: the inbox (`/notifications`: filters by reason, mark read, mark done, mark
all read), the header's unread badge (`/notifications/badge`, one COUNT, fetched by the page),
Settings > Notifications (where each reason goes, the e-mail address), the watch control of a
repository (`/{owner}/{name}/subscription`) and the e-mail's unsubscribe link, which works
without signing in (GET shows what it turns off, POST does it: RFC 8058's one-click)."""

from typing import Annotated, Any

from litestar import Controller, Request, get, post
from litestar.params import FromPath, QueryParameter, URLEncodedBody
from litestar.response import Redirect, Template

from forge.core.errors import ForgeError
from forge.http.auth import signed_in
from forge.http.deps import ActorDep, BaseUrlDep, DbSession, PathRepoDep, SettingsDep
from forge.http.pages.common import WebForm, or_form_error, page, safe_next
from forge.http.pages.forms import NO_ERRORS, form_errors
from forge.notify import inbox, preferences, subscriptions, unsubscribe
from forge.notify.inbox import Filters
from forge.notify.reasons import CHANNELS, REASON_LABELS, REASONS, WATCH_LEVELS

VIEWS = ("unread", "all", "participating", "done")
ViewQuery = Annotated[str, QueryParameter(name="view", max_length=16)]
ReasonQuery = Annotated[str, QueryParameter(name="reason", max_length=24)]


class BackForm(WebForm):
    next: str = ""


class WatchForm(WebForm):
    level: str = "participating"


class SettingsForm(WebForm):
    email: str = ""
    task: str = "web"
    review_requested: str = "web"
    assign: str = "web"
    mention: str = "web"
    author: str = "web"
    state_change: str = "web"
    comment: str = "web"
    subscribed: str = "web"

    def channels(self) -> dict[str, str]:
        return {reason: getattr(self, reason)[:16] for reason in REASONS}


def _filters(view: str, reason: str) -> Filters:
    return Filters(
        all=view == "all",
        participating=view == "participating",
        done=view == "done",
        reason=reason if reason in REASONS else None,
    )


class NotificationPages(Controller):
    path = "/notifications"
    include_in_schema = False

    @get("/", guards=[signed_in])
    async def inbox_page(
        self,
        request: Request[Any, Any, Any],
        db_session: DbSession,
        actor: ActorDep,
        forge_url: BaseUrlDep,
        view: ViewQuery = "unread",
        reason: ReasonQuery = "",
    ) -> Template:
        view = view if view in VIEWS else "unread"
        account_id = actor.principal.account_id
        assert account_id is not None
        threads = await inbox.list_for(db_session, account_id, _filters(view, reason), forge_url)
        return page(
            request, "notifications.html", threads=threads, view=view, reason=reason if reason in REASONS else "",
            views=VIEWS, reasons=REASONS, labels=REASON_LABELS, here=str(request.url.path) + (
                f"?{request.url.query}" if request.url.query else ""),
        )  # fmt: skip

    @get("/badge", guards=[signed_in])
    async def badge(self, request: Request[Any, Any, Any], db_session: DbSession, actor: ActorDep) -> Template:
        account_id = actor.principal.account_id
        assert account_id is not None
        count = await inbox.unread_count(db_session, account_id)
        return page(request, "_inbox_badge.html", count=count)

    @post("/{thread_id:int}/read", guards=[signed_in])
    async def mark_read(
        self,
        db_session: DbSession,
        actor: ActorDep,
        forge_url: BaseUrlDep,
        thread_id: FromPath[int],
        data: URLEncodedBody[BackForm],
    ) -> Redirect:
        await inbox.mark(db_session, actor, thread_id, forge_url)
        return Redirect(safe_next(data.next or "/notifications"), status_code=303)

    @post("/{thread_id:int}/done", guards=[signed_in])
    async def mark_done(
        self,
        db_session: DbSession,
        actor: ActorDep,
        forge_url: BaseUrlDep,
        thread_id: FromPath[int],
        data: URLEncodedBody[BackForm],
    ) -> Redirect:
        await inbox.mark(db_session, actor, thread_id, forge_url, done=True)
        return Redirect(safe_next(data.next or "/notifications"), status_code=303)

    @post("/read-all", guards=[signed_in])
    async def mark_all(self, db_session: DbSession, actor: ActorDep, data: URLEncodedBody[BackForm]) -> Redirect:
        await inbox.mark_all(db_session, actor)
        return Redirect(safe_next(data.next or "/notifications"), status_code=303)

    @get("/unsubscribe/{token:str}")
    async def unsubscribe_page(
        self, request: Request[Any, Any, Any], settings: SettingsDep, token: FromPath[str]
    ) -> Template:
        # A GET changes nothing: mail scanners open links. The page's button posts.
        what = unsubscribe.verify(settings.secret_key, token)
        return page(request, "notifications_unsubscribe.html", token=token, what=unsubscribe.describe(what), done=False)

    @post("/unsubscribe/{token:str}")
    async def unsubscribe_now(
        self, request: Request[Any, Any, Any], db_session: DbSession, settings: SettingsDep, token: FromPath[str]
    ) -> Template:
        client = request.client.host if request.client else ""
        what = await unsubscribe.apply(db_session, settings.secret_key, token, client)
        return page(request, "notifications_unsubscribe.html", token=token, what=unsubscribe.describe(what), done=True)


def _settings_page(
    request: Request[Any, Any, Any], values: dict[str, Any], *, refused: ForgeError | None = None, **extra: Any
) -> Template:
    errors = form_errors(refused, ["email", *REASONS]) if refused is not None else NO_ERRORS
    return page(
        request, "settings/notifications.html", refused=refused, errors=errors, values=values, reasons=REASONS,
        labels=REASON_LABELS, channels=CHANNELS, **extra,
    )  # fmt: skip


class NotificationSettingsPages(Controller):
    """Settings > Notifications: where each reason goes, and the e-mail address."""

    path = "/settings/notifications"
    include_in_schema = False
    guards = [signed_in]

    @get("/")
    async def settings_page(
        self, request: Request[Any, Any, Any], db_session: DbSession, actor: ActorDep, settings: SettingsDep
    ) -> Template:
        assert actor.principal.account_id is not None
        mine = await preferences.get(db_session, actor.principal.account_id)
        values = {"email": mine.email, **mine.channels}
        return _settings_page(request, values, email_on=bool(settings.smtp_host))

    @post("/")
    async def save(
        self,
        request: Request[Any, Any, Any],
        db_session: DbSession,
        actor: ActorDep,
        settings: SettingsDep,
        data: URLEncodedBody[SettingsForm],
    ) -> Template:
        account_id = actor.principal.account_id
        assert account_id is not None
        values = {"email": data.email[:254], **data.channels()}

        async def again(exc: ForgeError) -> Template:
            return _settings_page(request, values, refused=exc, email_on=bool(settings.smtp_host))

        saved = await or_form_error(
            preferences.save(db_session, actor, account_id, data.email, data.channels()), again, raise_404=False
        )
        if isinstance(saved, Template):
            return saved
        values = {"email": saved.email, **saved.channels}
        return _settings_page(request, values, notice="Notification settings saved.", email_on=bool(settings.smtp_host))


class WatchPages(Controller):
    """A repository's watch control (loaded into the repository's header) and its form."""

    path = "/{owner:str}/{name:str}/subscription"
    include_in_schema = False
    guards = [signed_in]

    @get("/")
    async def control(
        self, request: Request[Any, Any, Any], db_session: DbSession, actor: ActorDep, path_repo: PathRepoDep,
        forge_url: BaseUrlDep,
    ) -> Template:  # fmt: skip
        res = await path_repo.load()
        assert actor.principal.account_id is not None
        mine = await subscriptions.get(db_session, res, actor.principal.account_id, forge_url)
        return page(request, "repos/_watch.html", full_name=res.full_name, level=mine.level, levels=WATCH_LEVELS)

    @post("/")
    async def watch(
        self, db_session: DbSession, actor: ActorDep, path_repo: PathRepoDep, forge_url: BaseUrlDep,
        data: URLEncodedBody[WatchForm],
    ) -> Redirect:  # fmt: skip
        res = await path_repo.load()
        level = subscriptions.level_of(subscriptions.SubscriptionPut(level=data.level[:16]))  # type: ignore[arg-type]
        await subscriptions.put(db_session, actor, res, level, forge_url)
        return Redirect(f"/{res.full_name}", status_code=303)
