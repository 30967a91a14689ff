"""Web pages of one's own settings (`/settings/profile`, `/settings/password`; the old
`/settings/account/` redirects) and of any account's profile (`/{login}`: their repositories the
viewer may see, and for yourself, your tasks).

The profile route has one path segment, so it never meets the repository routes (`/{owner}/{name}`
and deeper); the site's own one-segment routes (`/admin`, `/repos`, `/tasks`, ...) are static
routes, which Litestar matches before a path parameter, and their names are reserved logins
(`accounts.RESERVED_LOGINS`), so no account can be named like one."""

from collections.abc import Awaitable, Callable, Sequence
from typing import Annotated, Any

from litestar import Controller, Request, get, post
from litestar.params import FromPath, QueryParameter, URLEncodedBody
from litestar.response import Redirect, Template
from sqlalchemy.ext.asyncio import AsyncSession

from forge.accounts import accounts, websessions
from forge.core.access import Principal
from forge.core.error_codes import Code
from forge.core.errors import ForgeError, InvalidInput, NotFound
from forge.db.models import Account
from forge.http.auth import signed_in
from forge.http.deps import ActorDep, BaseUrlDep, DatabaseDep, DbSession, SettingsDep
from forge.http.pages.common import WebForm, or_form_error, page, safe_next
from forge.http.pages.password_gate import must_change
from forge.repos import repositories

# The composition root hands in how to list an account's tasks (forge does not know the tasks
# package): `app.state.account_tasks(session, principal)` returns task reads, newest first.
AccountTasks = Callable[[AsyncSession, Principal], Awaitable[Sequence[Any]]]
PASSWORD_TEMPLATE = "settings/password.html"


async def _me(db_session: AsyncSession, actor: ActorDep) -> Account:
    me = await db_session.get(Account, actor.principal.account_id)
    assert me is not None  # the `signed_in` guard ran
    return me


class PasswordForm(WebForm):
    current_password: str = ""
    new_password: str = ""
    repeat_password: str = ""
    next: str = ""  # where a forced change came from (`forge.http.pages.password_gate`)


class ProfileForm(WebForm):
    display_name: str = ""


def _password_page(request: Request[Any, Any, Any], next_: str, status_code: int = 200, **extra: Any) -> Template:
    return page(
        request,
        PASSWORD_TEMPLATE,
        status_code=status_code,
        must_change=must_change(request),
        next=safe_next(next_) if next_ else "",
        **{"error": None, "notice": None, **extra},
    )


def _profile_page(request: Request[Any, Any, Any], account: Account, status_code: int = 200, **extra: Any) -> Template:
    return page(
        request,
        "settings/profile.html",
        status_code=status_code,
        account=account,
        display_name=extra.pop("display_name", account.display_name),
        **extra,
    )


class SettingsPages(Controller):
    """`/settings`: one place for a person's own settings, a side nav of sections (profile,
    password, tokens in `forge.http.pages.tokens`, model access in `forge.http.pages.model_keys`)."""

    path = "/settings"
    include_in_schema = False
    guards = [signed_in]

    @get("/")
    async def index(self) -> Redirect:
        return Redirect("/settings/profile", status_code=303)

    @get("/profile")
    async def profile_page(self, request: Request[Any, Any, Any], db_session: DbSession, actor: ActorDep) -> Template:
        return _profile_page(request, await _me(db_session, actor))

    @post("/profile")
    async def save_profile(
        self, request: Request[Any, Any, Any], db_session: DbSession, actor: ActorDep, data: URLEncodedBody[ProfileForm]
    ) -> Template:

        async def again(exc: ForgeError) -> Template:
            me = await _me(db_session, actor)
            return _profile_page(request, me, refused=exc, display_name=data.display_name[:200])

        account = await or_form_error(
            accounts.update_profile(db_session, actor, data.display_name), again, raise_404=False
        )
        if isinstance(account, Template):
            return account
        return _profile_page(request, account, notice="Profile saved.")

    @get("/password")
    async def password_page(
        self, request: Request[Any, Any, Any], next_: Annotated[str, QueryParameter(name="next")] = ""
    ) -> Template:
        return _password_page(request, next_)

    @post("/password")
    async def change_password(
        self,
        request: Request[Any, Any, Any],
        db: DatabaseDep,
        settings: SettingsDep,
        actor: ActorDep,
        data: URLEncodedBody[PasswordForm],
    ) -> Template:
        # No request-wide transaction: refusals are audited in transactions of their own.
        async def change() -> None:
            if data.new_password != data.repeat_password:
                raise InvalidInput("the new password and its repetition differ", code=Code.PASSWORD_MISMATCH)
            await accounts.change_password(
                db,
                settings,
                actor,
                data.current_password,
                data.new_password,
                keep_session=request.cookies.get(websessions.SESSION_COOKIE),
            )

        async def again(exc: ForgeError) -> Template:
            exc.audited = True  # change_password audits its refusals; a mismatch is the form's own
            return _password_page(request, data.next, refused=exc)

        changed = await or_form_error(change(), again, raise_404=False)
        if isinstance(changed, Template):
            return changed
        forced = must_change(request)  # as the session was when this request began
        return _password_page(
            request,
            data.next,
            notice="Password changed. Your other sessions were signed out; this one stays signed in.",
            continue_to=(safe_next(data.next) if data.next else "/") if forced else None,
        )


class OldSettingsPages(Controller):
    """Where the password lived before settings were one place (`/settings/account/`): bookmarks
    and forms of open tabs still arrive (a POST keeps its method and body through a 308)."""

    path = "/settings/account"
    include_in_schema = False

    @get("/")
    async def account_page(self) -> Redirect:
        return Redirect("/settings/password", status_code=301)

    @post("/password")
    async def change_password(self) -> Redirect:
        return Redirect("/settings/password", status_code=308)


class ProfilePages(Controller):
    include_in_schema = False

    @get("/{login:str}")
    async def profile(
        self,
        request: Request[Any, Any, Any],
        db_session: DbSession,
        actor: ActorDep,
        forge_url: BaseUrlDep,
        login: FromPath[str],
    ) -> Template:
        account = await accounts.get_by_login(db_session, login)
        if account is None:
            raise NotFound(f"no account {login!r}", code=Code.ACCOUNT_NOT_FOUND)
        principal = actor.principal
        found = await repositories.list_visible(db_session, principal, owner=account.login)
        repos = [repositories.to_read(r, principal, forge_url) for r in found]
        is_self = principal.account_id == account.id
        tasks: Sequence[Any] = []
        list_tasks: AccountTasks | None = getattr(request.app.state, "account_tasks", None)
        if is_self and list_tasks is not None:
            tasks = await list_tasks(db_session, principal)
        return page(
            request,
            "profile.html",
            account=await accounts.to_read(db_session, account),
            repos=repos,
            is_self=is_self,
            # Who is an instance admin, or disabled, is for the account itself and admins: a stranger
            # picking targets learns nothing from a profile.
            show_status=is_self or principal.is_admin,
            tasks=tasks,
        )
