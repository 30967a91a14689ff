"""Web pages of one's own account (`/settings/account`: the password) and of any account's profile
(`/{login}`: their repositories the viewer may see, and for yourself, your tasks).

The profile route has one path segment, so it never meets the repository routes (`/{owner}/{name}`
and deeper); the site's own one-segment routes (`/admin`, `/repos`, `/tasks`, ...) are static
routes, which Litestar matches before a path parameter, and their names are reserved logins
(`accounts.RESERVED_LOGINS`), so no account can be named like one."""

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from litestar import Controller, Request, get, post
from litestar.params import FromPath, URLEncodedBody
from litestar.response import Template
from sqlalchemy.ext.asyncio import AsyncSession

from forge import accounts, repositories, websessions
from forge.access import Principal
from forge.deps import ActorDep, BaseUrlDep, DatabaseDep, DbSession, SettingsDep
from forge.error_codes import Code
from forge.errors import ForgeError, InvalidInput, NotFound
from forge.pages import WebForm, page, signed_in

# The composition root hands in how to list an account's tasks (forge does not know the tasks
# package): `app.state.account_tasks(session, principal)` returns task reads, newest first.
AccountTasks = Callable[[AsyncSession, Principal], Awaitable[Sequence[Any]]]


class PasswordForm(WebForm):
    current_password: str = ""
    new_password: str = ""
    repeat_password: str = ""


class AccountPages(Controller):
    path = "/settings/account"
    include_in_schema = False
    guards = [signed_in]

    @get("/")
    async def account_page(self, request: Request[Any, Any, Any]) -> Template:
        return page(request, "account.html", error=None, notice=None)

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
        try:
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
        except ForgeError as exc:
            exc.audited = True  # change_password audits its refusals; a mismatch is the form's own
            response = page(request, "account.html", status_code=exc.status, error=exc.detail, notice=None)
            if exc.status == 429:
                response.headers["Retry-After"] = str(getattr(exc, "retry_after", 60))
            return response
        return page(
            request,
            "account.html",
            error=None,
            notice="Password changed. Your other sessions were signed out; this one stays signed in.",
        )


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
