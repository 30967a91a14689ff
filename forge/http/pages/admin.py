"""Admin: the instance's accounts (people and bots: create, disable, enable, a bot's tokens, a
password reset) and the audit log. Instance admins only."""

from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from litestar import Controller, Request, get, post
from litestar.params import FromPath, Parameter, URLEncodedBody
from litestar.response import Redirect, Template

from forge.accounts import accounts, tokens, websessions
from forge.core.access import Scope
from forge.core.errors import ForgeError
from forge.core.security import generate_password
from forge.db import audit
from forge.http.deps import ActorDep, DbSession, SettingsDep, TokenCacheDep
from forge.http.pages.common import WebForm, instance_admin, or_form_error, page
from forge.http.pages.forms import NO_ERRORS, form_errors
from forge.http.pages.new_token import (
    NEW_TOKEN_COOKIE,
    TokenForm,
    clear_created,
    create_from_form,
    created_redirect,
    take_created,
)


class NewAccountForm(WebForm):
    login: str = ""
    kind: str = "user"
    is_admin: str = ""
    owner: str = ""


# The services' refusals (their codes) -> the field they concern: the New account form's, and
# those of an account's row (`token-name-bob`: the row's login is appended).
NEW_ACCOUNT_ALIASES = {"invalid_login": "login", "login_taken": "login", "account_not_found": "owner"}
ROW_ALIASES = {
    "token": {"invalid_token_name": "token-name", "invalid_scope": "token-scopes"},
    "password": {"weak_password": "reset", "invalid_password": "reset"},
}


class ResetPasswordForm(WebForm):
    password: str = ""  # blank: a random one, shown once


class AdminPages(Controller):
    path = "/admin"
    include_in_schema = False
    guards = [instance_admin]

    async def _render(
        self, request: Request[Any, Any, Any], db_session: DbSession, status_code: int = 200, **context: Any
    ) -> Template:
        rows = await accounts.list_accounts(db_session)
        reads = [await accounts.to_read(db_session, a) for a in rows]
        # A bot token created by the previous POST (POST-redirect-GET), shown once.
        created = await take_created(request, db_session)
        response = page(
            request,
            "admin.html",
            status_code=status_code,
            accounts=reads,
            scopes=[s.value for s in Scope if s is not Scope.ADMIN],
            created=created,
            **{"account_form": NewAccountForm(), "errors": NO_ERRORS, "refused_form": "", **context},
        )
        return clear_created(response, "/admin") if NEW_TOKEN_COOKIE in request.cookies else response

    def _row_refused(
        self, request: Request[Any, Any, Any], db_session: DbSession, login: str, action: str, form: WebForm
    ) -> Callable[[ForgeError], Awaitable[Template]]:
        """A refused form of an account's row: the page again with that form open, as it was sent,
        the refusal beside the field it concerns (no such account: the refusal alone)."""

        async def again(exc: ForgeError) -> Template:
            if exc.status == 404:
                return await self._render(request, db_session, refused=exc)
            aliases = {code: f"{name}-{login}" for code, name in ROW_ALIASES[action].items()}
            errors = form_errors(exc, aliases.values(), aliases)
            return await self._render(
                request, db_session, refused=exc, errors=errors, refused_form=action, refused_login=login, row_form=form
            )

        return again

    @get("/")
    async def index(self, request: Request[Any, Any, Any], db_session: DbSession) -> Template:
        return await self._render(request, db_session)

    @post("/accounts")
    async def create_account(
        self,
        request: Request[Any, Any, Any],
        db_session: DbSession,
        actor: ActorDep,
        data: URLEncodedBody[NewAccountForm],
    ) -> Template:
        login = data.login.strip()

        async def create() -> str | None:
            """The new user's generated password; None for a bot."""
            if data.kind == "bot":
                owner = await accounts.require_by_login(db_session, data.owner.strip()) if data.owner.strip() else None
                await accounts.create_bot(db_session, actor, login, owner=owner)
                return None
            password = generate_password()
            await accounts.create_user(
                db_session, actor, login, password, is_admin=bool(data.is_admin), must_change_password=True
            )
            return password

        async def again(exc: ForgeError) -> Template:
            # Shown again as typed, the refusal beside the field it concerns.
            errors = form_errors(exc, NewAccountForm.__struct_fields__, NEW_ACCOUNT_ALIASES)
            return await self._render(
                request, db_session, refused=exc, errors=errors, account_form=data, refused_form="account"
            )

        password = await or_form_error(create(), again, raise_404=False)
        if isinstance(password, Template):
            return password
        if password is None:
            return await self._render(request, db_session, notice=f"bot {login} created")
        return await self._render(
            request, db_session, notice=f"user {login} created", new_password=password, new_login=login
        )

    @post("/accounts/{login:str}/disable")
    async def disable(
        self, db_session: DbSession, actor: ActorDep, token_cache: TokenCacheDep, login: FromPath[str]
    ) -> Redirect:
        account = await accounts.set_disabled(db_session, actor, login, True)
        await websessions.destroy_all_for(db_session, account.id)
        token_cache.clear()
        return Redirect("/admin", status_code=303)

    @post("/accounts/{login:str}/enable")
    async def enable(self, db_session: DbSession, actor: ActorDep, login: FromPath[str]) -> Redirect:
        await accounts.set_disabled(db_session, actor, login, False)
        return Redirect("/admin", status_code=303)

    @post("/accounts/{login:str}/tokens")
    async def create_token(
        self,
        request: Request[Any, Any, Any],
        db_session: DbSession,
        actor: ActorDep,
        settings: SettingsDep,
        login: FromPath[str],
        data: URLEncodedBody[TokenForm],
    ) -> Template | Redirect:

        async def create() -> tokens.TokenCreated:
            return await create_from_form(db_session, actor, await accounts.require_by_login(db_session, login), data)

        created = await or_form_error(
            create(), self._row_refused(request, db_session, login, "token", data), raise_404=False
        )
        if isinstance(created, Template):
            return created
        return created_redirect("/admin/", created, settings)

    @post("/accounts/{login:str}/password")
    async def reset_password(
        self,
        request: Request[Any, Any, Any],
        db_session: DbSession,
        actor: ActorDep,
        login: FromPath[str],
        data: URLEncodedBody[ResetPasswordForm],
    ) -> Template:
        password = data.password or generate_password()
        change = accounts.set_password(
            db_session,
            actor,
            login,
            password,
            keep_session=request.cookies.get(websessions.SESSION_COOKIE),
            generated=not data.password,
        )
        # The typed password is never written back into the page.
        again = self._row_refused(request, db_session, login, "password", ResetPasswordForm())
        reset = await or_form_error(change, again, raise_404=False)
        if isinstance(reset, Template):
            return reset
        notice = f"password of {login} set; their sessions were signed out"
        if data.password:
            return await self._render(request, db_session, notice=notice)
        return await self._render(request, db_session, notice=notice, new_password=password, new_login=login)

    @get("/audit")
    async def audit_page(
        self,
        request: Request[Any, Any, Any],
        db_session: DbSession,
        before: Annotated[int | None, Parameter(ge=1)] = None,
    ) -> Template:
        rows = await audit.tail(db_session, limit=100, before_id=before)
        return page(request, "audit.html", rows=rows, next_before=rows[-1].id if len(rows) == 100 else None)
