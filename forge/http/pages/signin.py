"""Signing in and out: the sign-in form (a pre-session CSRF cookie before there is a session), a
new session on success (the previous one ended: no fixation), and signing out."""

from typing import Annotated, Any

from litestar import Controller, Request, get, post
from litestar.datastructures import Cookie
from litestar.params import QueryParameter, URLEncodedBody
from litestar.response import Redirect, Template

from forge.accounts import accounts, websessions
from forge.core.access import Principal
from forge.core.errors import ForgeError
from forge.core.security import random_id
from forge.db import audit
from forge.db.audit import Actor
from forge.http.deps import ActorDep, DatabaseDep, DbSession, SettingsDep
from forge.http.pages.common import WebForm, or_form_error, page, safe_next


class SignInForm(WebForm):
    login: str = ""
    password: str = ""
    next: str = "/"


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

        async def again(exc: ForgeError) -> Template:
            exc.audited = True  # authenticate_password wrote the refusal row
            return page(
                request,
                "signin.html",
                refused=exc,
                presession_csrf=data.csrf_token,
                next=safe_next(data.next),
                login=data.login,
            )

        account = await or_form_error(
            accounts.authenticate_password(db, settings, actor, data.login, data.password), again, raise_404=False
        )
        if isinstance(account, Template):
            return account
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
