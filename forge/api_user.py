"""REST: the caller (`/api/v1/user`) and its personal access tokens."""

from typing import Annotated

from litestar import Controller, delete, get, post
from litestar.params import JSONBody, Parameter

from forge import tokens
from forge.auth import signed_in
from forge.deps import ActorDep, DbSession, PrincipalDep, TokenCacheDep
from forge.error_codes import Code
from forge.errors import Unauthenticated
from forge.models import Account
from forge.schemas import TokenCreate, UserRead


async def _caller(db_session: DbSession, actor: ActorDep) -> Account:
    account_id = actor.principal.account_id
    account = await db_session.get(Account, account_id) if account_id is not None else None
    if account is None:
        raise Unauthenticated("sign in or send a token", code=Code.UNAUTHENTICATED)
    return account


class UserController(Controller):
    guards = [signed_in]
    path = "/api/v1/user"
    tags = ["user"]

    @get("/", summary="The authenticated caller")
    async def get_user(self, principal: PrincipalDep) -> UserRead:
        # Answered from what authentication resolved: the hot path of every bot, no extra query.
        if principal.account_id is None or principal.created_at is None or principal.type == "Anonymous":
            raise Unauthenticated("sign in or send a token", code=Code.UNAUTHENTICATED)
        scopes = principal.scopes
        return UserRead(
            id=principal.account_id,
            login=principal.login,
            type=principal.type,
            display_name=principal.display_name,
            is_admin=principal.is_admin,
            created_at=principal.created_at,
            token_scopes=sorted(s.value for s in scopes) if scopes is not None else None,
        )

    @get("/tokens", summary="The caller's tokens (secrets are never shown again)")
    async def list_tokens(self, db_session: DbSession, actor: ActorDep) -> list[tokens.TokenRead]:
        return await tokens.list_for(db_session, await _caller(db_session, actor))

    @post("/tokens", summary="Create a token (the secret is in the response, once)")
    async def create_token(
        self, db_session: DbSession, actor: ActorDep, data: JSONBody[TokenCreate]
    ) -> tokens.TokenCreated:
        owner = await _caller(db_session, actor)
        return await tokens.create(db_session, actor, owner, data.name, data.scopes, data.expires_days)

    @delete("/tokens/{token_id:int}", summary="Revoke a token", status_code=200)
    async def revoke_token(
        self,
        db_session: DbSession,
        actor: ActorDep,
        token_cache: TokenCacheDep,
        token_id: Annotated[int, Parameter(gt=0)],
    ) -> tokens.TokenRead:
        await _caller(db_session, actor)
        return await tokens.revoke(db_session, actor, token_id, token_cache)
