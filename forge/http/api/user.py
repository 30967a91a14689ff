"""REST: the caller (`/api/v1/user`) and its personal access tokens."""

from typing import Annotated

from litestar import Controller, delete, get, post, put
from litestar.params import FromPath, JSONBody, Parameter

from forge.accounts import model_keys, tokens
from forge.core.error_codes import Code
from forge.core.errors import Unauthenticated
from forge.db.models import Account
from forge.http.api.schemas import TokenCreate, UserRead
from forge.http.auth import signed_in
from forge.http.deps import ActorDep, DbSession, PrincipalDep, SettingsDep, TokenCacheDep


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

    # Personal model keys ("model access"): write-only; reads never return the key.

    @get("/model-keys", summary="The caller's personal model keys (whether set, never the key)")
    async def list_model_keys(self, db_session: DbSession, actor: ActorDep) -> list[model_keys.ModelKeyRead]:
        return await model_keys.list_for(db_session, await _caller(db_session, actor))

    @get("/model-keys/{provider:str}", summary="Whether the caller has a personal key for a provider")
    async def get_model_key(
        self, db_session: DbSession, actor: ActorDep, provider: FromPath[str]
    ) -> model_keys.ModelKeyRead:
        return await model_keys.get(db_session, await _caller(db_session, actor), provider)

    @put("/model-keys/{provider:str}", summary="Set the caller's personal key for a provider (write-only)")
    async def put_model_key(
        self,
        db_session: DbSession,
        actor: ActorDep,
        settings: SettingsDep,
        provider: FromPath[str],
        data: JSONBody[model_keys.ModelKeyPut],
    ) -> model_keys.ModelKeyRead:
        owner = await _caller(db_session, actor)
        return await model_keys.put(db_session, settings, actor, owner, provider, data)

    @delete("/model-keys/{provider:str}", summary="Remove the caller's personal key for a provider", status_code=200)
    async def delete_model_key(
        self, db_session: DbSession, actor: ActorDep, provider: FromPath[str]
    ) -> model_keys.ModelKeyRead:
        return await model_keys.remove(db_session, actor, await _caller(db_session, actor), provider)
