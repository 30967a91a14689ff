"""Settings > Tokens: a person's personal access tokens, made (the secret shown once, see
`new_token`), listed and revoked."""

from typing import Any

from litestar import Controller, Request, get, post
from litestar.params import FromPath, URLEncodedBody
from litestar.response import Redirect, Template

from forge.accounts import tokens
from forge.core.access import Scope
from forge.core.error_codes import Code
from forge.core.errors import ForgeError, NotFound
from forge.db.models import Account
from forge.http.auth import signed_in
from forge.http.deps import ActorDep, DbSession, SettingsDep, TokenCacheDep
from forge.http.pages.common import or_form_error, page
from forge.http.pages.forms import NO_ERRORS, FormErrors, form_errors
from forge.http.pages.new_token import (
    NEW_TOKEN_COOKIE,
    TokenForm,
    clear_created,
    create_from_form,
    created_redirect,
    form_scopes,
    take_created,
)

# The token service's refusals (their codes) -> the New token form's field they concern.
TOKEN_ALIASES = {"invalid_token_name": "name", "invalid_scope": "scopes", "invalid_expiry": "expires_days"}


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
        errors: FormErrors = NO_ERRORS,
        **context: Any,
    ) -> Template:
        me = await db_session.get(Account, actor.principal.account_id)
        assert me is not None
        created = await take_created(request, db_session, owner_id=me.id)
        response = page(
            request,
            "tokens.html",
            status_code=status_code,
            tokens=await tokens.list_for(db_session, me),
            scopes=[s.value for s in Scope if s is not Scope.ADMIN or me.is_admin],
            created=created,
            form=form or TokenForm(),
            chosen=form_scopes(form.scopes) if form else [],
            errors=errors,
            **context,
        )
        return clear_created(response, "/settings/tokens") if NEW_TOKEN_COOKIE in request.cookies else response

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

        async def again(exc: ForgeError) -> Template:
            errors = form_errors(exc, TokenForm.__struct_fields__, TOKEN_ALIASES)
            return await self._render(request, db_session, actor, refused=exc, form=data, errors=errors)

        created = await or_form_error(create_from_form(db_session, actor, me, data), again, raise_404=False)
        if isinstance(created, Template):
            return created
        return created_redirect("/settings/tokens/", created, settings)

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
