"""Web pages of the host: sign-in/out, dashboard, tokens, admin. Thin: parse, authorize, call the
same services as the REST API, render. Forms work without JavaScript (POST + redirect)."""

import hmac
from typing import Annotated, Any

import msgspec
from litestar import Controller, Request, get, post
from litestar.connection import ASGIConnection
from litestar.datastructures import Cookie
from litestar.handlers import BaseRouteHandler
from litestar.params import FromPath, Parameter, QueryParameter, URLEncodedBody
from litestar.response import Redirect, Template
from sqlalchemy.ext.asyncio import AsyncSession

from forge.accounts import accounts, tokens, websessions
from forge.core.access import INSTANCE, Action, Principal, Scope, require
from forge.core.error_codes import Code
from forge.core.errors import ForgeError, InvalidInput, NotFound
from forge.core.security import generate_password, random_id, sha256_hex
from forge.core.settings import Settings
from forge.db import audit
from forge.db.audit import Actor
from forge.db.models import AccessToken, Account
from forge.http.auth import signed_in
from forge.http.deps import ActorDep, DatabaseDep, DbSession, SettingsDep, TokenCacheDep
from forge.http.pages.context import base_context
from forge.repos import repositories


def page(
    request: Request[Any, Any, Any],
    name: str,
    status_code: int = 200,
    *,
    refused: ForgeError | None = None,
    **context: Any,
) -> Template:
    """Render a page with what every page needs (who is signed in, the CSRF token).

    `refused`: the service's refusal of the form the page shows again, the one way a page turns a
    `ForgeError` into what it shows: the error's status, its message as `error` (the form's alert;
    `forms.form_errors` also places it at the input it concerns) and, for a rate limit, the
    `Retry-After` the API sends too."""
    headers: dict[str, str] = {}
    if refused is not None:
        status_code = refused.status
        context["error"] = refused.detail
        if refused.status == 429:
            headers["Retry-After"] = str(getattr(refused, "retry_after", 60))
    return Template(
        template_name=name,
        context={**base_context(request), **context},
        status_code=status_code,
        headers=headers or None,
    )


class WebForm(msgspec.Struct, kw_only=True):
    """A form posted by a page. `forge.http.csrf` checks the token before any handler runs."""

    csrf_token: str = ""


def instance_admin(connection: ASGIConnection[Any, Any, Any, Any], handler: BaseRouteHandler) -> None:
    """Guard: pages for instance admins."""
    signed_in(connection, handler)
    require(connection.scope["user"], Action.INSTANCE_ADMIN, INSTANCE)


class SignInForm(WebForm):
    login: str = ""
    password: str = ""
    next: str = "/"


def safe_next(value: str) -> str:
    # Only same-site paths: no scheme, no host, no protocol-relative `//evil`.
    if not value.startswith("/") or value.startswith("//") or "\\" in value:
        return "/"
    return value


class AuthPages(Controller):
    include_in_schema = False

    @get("/signin")
    async def signin_form(
        self, request: Request[Any, Any, Any], next_: Annotated[str, QueryParameter(name="next")] = "/"
    ) -> Template:
        token = request.cookies.get(websessions.PRESESSION_COOKIE) or random_id(24)
        response = page(request, "signin.html", presession_csrf=token, next=safe_next(next_), error=None)
        response.cookies.append(
            Cookie(
                key=websessions.PRESESSION_COOKIE,
                value=token,
                httponly=True,
                samesite="strict",
                path="/signin",
            )
        )
        return response

    @post("/signin", opt={"csrf": "presession"})
    async def signin(
        self,
        request: Request[Any, Any, Any],
        db: DatabaseDep,
        settings: SettingsDep,
        actor: ActorDep,
        data: URLEncodedBody[SignInForm],
    ) -> Template | Redirect:
        try:
            account = await accounts.authenticate_password(db, settings, actor, data.login, data.password)
        except ForgeError as exc:
            exc.audited = True  # authenticate_password wrote the refusal row
            return page(
                request,
                "signin.html",
                refused=exc,
                presession_csrf=data.csrf_token,
                next=safe_next(data.next),
                login=data.login,
            )
        # No request-wide write transaction here: a refused sign-in writes its audit row in a
        # transaction of its own, which must not wait on a lock this request holds.
        signed_in = Actor(
            principal=Principal(account_id=account.id, login=account.login, type="User", via="session"),
            client_addr=actor.client_addr,
            request_id=actor.request_id,
        )
        async with db.session(write=True) as db_session:
            previous = request.cookies.get(websessions.SESSION_COOKIE)
            if previous:
                await websessions.destroy(db_session, previous)  # no session fixation, no stale sessions
            sid = await websessions.create(
                db_session,
                account,
                days=settings.session_days,
                client_addr=actor.client_addr,
                user_agent=request.headers.get("user-agent", ""),
            )
            audit.record(db_session, signed_in, "auth.sign_in", account.login_key)
        return Redirect(
            safe_next(data.next),
            status_code=303,
            cookies=[
                Cookie(
                    key=websessions.SESSION_COOKIE,
                    value=sid,
                    httponly=True,
                    secure=settings.secure_cookies,
                    samesite="lax",
                    max_age=settings.session_days * 86400,
                    path="/",
                ),
                Cookie(key=websessions.PRESESSION_COOKIE, value="", max_age=0, path="/signin"),
            ],
        )

    @post("/signout")
    async def signout(self, request: Request[Any, Any, Any], db_session: DbSession, actor: ActorDep) -> Redirect:
        sid = request.cookies.get(websessions.SESSION_COOKIE)
        if sid:
            await websessions.destroy(db_session, sid)
            if actor.principal.is_authenticated:
                audit.record(db_session, actor, "auth.sign_out", actor.principal.login.lower())
        return Redirect(
            "/signin",
            status_code=303,
            cookies=[Cookie(key=websessions.SESSION_COOKIE, value="", max_age=0, path="/")],
        )


class HomePages(Controller):
    include_in_schema = False

    @get("/")
    async def dashboard(
        self, request: Request[Any, Any, Any], db_session: DbSession, settings: SettingsDep
    ) -> Template | Redirect:
        principal = request.scope.get("user")
        if principal is None or not principal.is_authenticated:
            return Redirect("/signin", status_code=303)
        found = await repositories.list_visible(db_session, principal)
        repos = [repositories.to_read(r, principal, settings.effective_base_url) for r in found]
        return page(request, "dashboard.html", repos=repos)


class TokenForm(WebForm):
    name: str = ""
    scopes: list[str] | str = msgspec.field(default_factory=list)
    expires_days: str = ""


def _form_scopes(value: list[str] | str) -> list[str]:
    return [value] if isinstance(value, str) else value


async def _create_token(db_session: AsyncSession, actor: Actor, owner: Account, form: TokenForm) -> tokens.TokenCreated:
    """A token from the form, for the signed-in person (Tokens) or, by an admin, for a bot."""
    return await tokens.create(
        db_session, actor, owner, form.name, _form_scopes(form.scopes), _expiry(form.expires_days)
    )


def _expiry(value: str) -> int | None:
    value = value.strip()
    if not value:
        return None
    if not (value.isascii() and value.isdecimal()):
        raise InvalidInput("expiry must be a number of days", code=Code.INVALID_EXPIRY)
    return int(value)


# The secret of a token just created travels from the POST to the page it redirects to in a
# short-lived cookie scoped to that page (POST-redirect-GET: a reload never mints a second token);
# the page that shows it clears the cookie, so it is shown once.
NEW_TOKEN_COOKIE = "fh_new_token"
_NEW_TOKEN_SECONDS = 120


def _created_redirect(target: str, created: tokens.TokenCreated, settings: Settings) -> Redirect:
    return Redirect(
        target,
        status_code=303,
        cookies=[
            Cookie(
                key=NEW_TOKEN_COOKIE,
                value=f"{created.info.id}.{created.token}",
                httponly=True,
                secure=settings.secure_cookies,
                samesite="strict",
                max_age=_NEW_TOKEN_SECONDS,
                path=target.rstrip("/") or "/",
            )
        ],
    )


async def _take_created(
    request: Request[Any, Any, Any], db_session: AsyncSession, *, owner_id: int | None = None
) -> tokens.TokenCreated | None:
    """The token the previous POST created, if the cookie names a live one (of `owner_id`, when
    given) and carries its secret."""
    token_id, _, secret = request.cookies.get(NEW_TOKEN_COOKIE, "").partition(".")
    if not (token_id.isascii() and token_id.isdecimal()) or len(token_id) > 18 or len(secret) <= 8:
        return None
    row = await db_session.get(AccessToken, int(token_id))
    # The whole secret must hash to the row's: a cookie planted by someone else (a sibling
    # subdomain, plain http) cannot make the page show a secret that is not the token.
    if row is None or row.revoked_at is not None or not hmac.compare_digest(sha256_hex(secret), row.token_hash):
        return None
    owner = await db_session.get(Account, row.account_id)
    if owner is None or (owner_id is not None and owner.id != owner_id):
        return None
    return tokens.TokenCreated(token=secret, info=tokens.to_read(row, owner.login))


def _clear_created(response: Template, path: str) -> Template:
    response.cookies.append(Cookie(key=NEW_TOKEN_COOKIE, value="", max_age=0, path=path))
    return response


class TokenPages(Controller):
    path = "/settings/tokens"
    include_in_schema = False
    guards = [signed_in]

    async def _render(
        self,
        request: Request[Any, Any, Any],
        db_session: DbSession,
        actor: ActorDep,
        status_code: int = 200,
        form: TokenForm | None = None,
        **context: Any,
    ) -> Template:
        me = await db_session.get(Account, actor.principal.account_id)
        assert me is not None
        created = await _take_created(request, db_session, owner_id=me.id)
        response = page(
            request,
            "tokens.html",
            status_code=status_code,
            tokens=await tokens.list_for(db_session, me),
            scopes=[s.value for s in Scope if s is not Scope.ADMIN or me.is_admin],
            created=created,
            form=form or TokenForm(),
            chosen=_form_scopes(form.scopes) if form else [],
            **context,
        )
        return _clear_created(response, "/settings/tokens") if NEW_TOKEN_COOKIE in request.cookies else response

    @get("/")
    async def list_page(self, request: Request[Any, Any, Any], db_session: DbSession, actor: ActorDep) -> Template:
        return await self._render(request, db_session, actor)

    @post("/")
    async def create(
        self,
        request: Request[Any, Any, Any],
        db_session: DbSession,
        actor: ActorDep,
        settings: SettingsDep,
        data: URLEncodedBody[TokenForm],
    ) -> Template | Redirect:
        me = await db_session.get(Account, actor.principal.account_id)
        assert me is not None
        try:
            created = await _create_token(db_session, actor, me, data)
        except ForgeError as exc:
            return await self._render(request, db_session, actor, refused=exc, form=data)
        return _created_redirect("/settings/tokens/", created, settings)

    @get("/{token_id:int}/revoke")
    async def confirm_revoke(
        self, request: Request[Any, Any, Any], db_session: DbSession, actor: ActorDep, token_id: FromPath[int]
    ) -> Template:
        me = await db_session.get(Account, actor.principal.account_id)
        assert me is not None
        found = [t for t in await tokens.list_for(db_session, me) if t.id == token_id]
        if not found:
            raise NotFound(f"no token {token_id}", code=Code.TOKEN_NOT_FOUND)
        return page(request, "token_revoke.html", token=found[0])

    @post("/{token_id:int}/revoke")
    async def revoke(
        self, db_session: DbSession, actor: ActorDep, token_cache: TokenCacheDep, token_id: FromPath[int]
    ) -> Redirect:
        await tokens.revoke(db_session, actor, token_id, token_cache)
        return Redirect("/settings/tokens", status_code=303)


class NewAccountForm(WebForm):
    login: str = ""
    kind: str = "user"
    is_admin: str = ""
    owner: str = ""


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
        created = await _take_created(request, db_session)
        response = page(
            request,
            "admin.html",
            status_code=status_code,
            accounts=reads,
            scopes=[s.value for s in Scope if s is not Scope.ADMIN],
            created=created,
            **context,
        )
        return _clear_created(response, "/admin") if NEW_TOKEN_COOKIE in request.cookies else response

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
        try:
            if data.kind == "bot":
                owner = await accounts.require_by_login(db_session, data.owner) if data.owner.strip() else None
                await accounts.create_bot(db_session, actor, data.login.strip(), owner=owner)
                return await self._render(request, db_session, notice=f"bot {data.login} created")
            password = generate_password()
            await accounts.create_user(
                db_session, actor, data.login.strip(), password, is_admin=bool(data.is_admin), must_change_password=True
            )
        except ForgeError as exc:
            return await self._render(request, db_session, refused=exc)
        return await self._render(
            request,
            db_session,
            notice=f"user {data.login} created",
            new_password=password,
            new_login=data.login,
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
        try:
            created = await _create_token(db_session, actor, await accounts.require_by_login(db_session, login), data)
        except ForgeError as exc:
            return await self._render(request, db_session, refused=exc)
        return _created_redirect("/admin/", created, settings)

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
        try:
            await accounts.set_password(
                db_session,
                actor,
                login,
                password,
                keep_session=request.cookies.get(websessions.SESSION_COOKIE),
                generated=not data.password,
            )
        except ForgeError as exc:
            return await self._render(request, db_session, refused=exc)
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
