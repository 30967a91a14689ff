"""REST: instance administration (users, bots, their tokens, the audit log, the network
allow-lists). Admins only."""

from typing import Annotated

from litestar import Controller, delete, get, patch, post, put
from litestar.params import FromPath, JSONBody, Parameter

from forge.accounts import accounts, tokens, websessions
from forge.accounts.accounts import AccountRead
from forge.core.access import INSTANCE, Action, require
from forge.core.security import generate_password
from forge.db import allowlists, audit
from forge.db.audit import AuditRead
from forge.http.api.schemas import (
    AccountUpdate,
    BotCreate,
    PasswordSet,
    PasswordSetResult,
    TokenCreate,
    UserCreate,
    UserCreated,
)
from forge.http.auth import signed_in
from forge.http.deps import ActorDep, DbSession, SettingsDep, TokenCacheDep


class AdminController(Controller):
    guards = [signed_in]
    path = "/api/v1/admin"
    tags = ["admin"]

    @get("/accounts", summary="All accounts")
    async def list_accounts(self, db_session: DbSession, actor: ActorDep) -> list[AccountRead]:
        require(actor.principal, Action.INSTANCE_ADMIN, INSTANCE)
        return [await accounts.to_read(db_session, a) for a in await accounts.list_accounts(db_session)]

    @post("/users", summary="Create a person's account")
    async def create_user(self, db_session: DbSession, actor: ActorDep, data: JSONBody[UserCreate]) -> UserCreated:
        require(actor.principal, Action.INSTANCE_ADMIN, INSTANCE)
        password = data.password or generate_password()
        await accounts.create_user(
            db_session,
            actor,
            data.login,
            password,
            is_admin=data.is_admin,
            display_name=data.display_name,
            must_change_password=not data.password,
        )
        return UserCreated(login=data.login, password=None if data.password else password)

    @post("/bots", summary="Create a bot account")
    async def create_bot(self, db_session: DbSession, actor: ActorDep, data: JSONBody[BotCreate]) -> AccountRead:
        require(actor.principal, Action.INSTANCE_ADMIN, INSTANCE)
        owner = await accounts.require_by_login(db_session, data.owner) if data.owner else None
        bot = await accounts.create_bot(db_session, actor, data.login, owner=owner, display_name=data.display_name)
        return await accounts.to_read(db_session, bot)

    @patch("/accounts/{login:str}", summary="Disable or enable an account")
    async def update_account(
        self,
        db_session: DbSession,
        actor: ActorDep,
        token_cache: TokenCacheDep,
        login: FromPath[str],
        data: JSONBody[AccountUpdate],
    ) -> AccountRead:
        require(actor.principal, Action.INSTANCE_ADMIN, INSTANCE)
        account = await accounts.require_by_login(db_session, login)
        if data.disabled is not None:
            account = await accounts.set_disabled(db_session, actor, login, data.disabled)
            if data.disabled:
                await websessions.destroy_all_for(db_session, account.id)
                token_cache.clear()
        return await accounts.to_read(db_session, account)

    @put("/accounts/{login:str}/password", summary="Set a person's password (their sessions end)")
    async def set_password(
        self, db_session: DbSession, actor: ActorDep, login: FromPath[str], data: JSONBody[PasswordSet]
    ) -> PasswordSetResult:
        require(actor.principal, Action.INSTANCE_ADMIN, INSTANCE)
        password = data.password or generate_password()
        ended = await accounts.set_password(db_session, actor, login, password, generated=not data.password)
        account = await accounts.require_by_login(db_session, login)
        return PasswordSetResult(
            login=account.login, password=None if data.password else password, sessions_ended=ended
        )

    @post("/accounts/{login:str}/tokens", summary="Create a token for an account (e.g. a bot)")
    async def create_token(
        self, db_session: DbSession, actor: ActorDep, login: FromPath[str], data: JSONBody[TokenCreate]
    ) -> tokens.TokenCreated:
        require(actor.principal, Action.INSTANCE_ADMIN, INSTANCE)
        owner = await accounts.require_by_login(db_session, login)
        return await tokens.create(db_session, actor, owner, data.name, data.scopes, data.expires_days)

    @get("/audit", summary="The audit log, newest first")
    async def audit_log(
        self,
        db_session: DbSession,
        actor: ActorDep,
        limit: Annotated[int, Parameter(ge=1, le=500)] = 50,
        before: Annotated[int | None, Parameter(ge=1)] = None,
    ) -> list[AuditRead]:
        require(actor.principal, Action.INSTANCE_ADMIN, INSTANCE)
        return list(await audit.tail(db_session, limit=limit, before_id=before))

    @get("/allowed-hosts", summary="The model and webhook allow-lists (the operator's floor and the admins' hosts)")
    async def allow_lists(
        self, db_session: DbSession, actor: ActorDep, settings: SettingsDep
    ) -> list[allowlists.AllowListRead]:
        require(actor.principal, Action.INSTANCE_ADMIN, INSTANCE)
        return [await allowlists.read(db_session, settings, name) for name in allowlists.LISTS]

    @post(
        "/allowed-hosts/{list_name:str}",
        summary="Allow a host for model endpoints or webhooks (in force at once, no restart)",
    )
    async def allow_host(
        self,
        db_session: DbSession,
        actor: ActorDep,
        settings: SettingsDep,
        list_name: FromPath[str],
        data: JSONBody[allowlists.AllowedHostCreate],
    ) -> allowlists.AllowedHostRead:
        require(actor.principal, Action.INSTANCE_ADMIN, INSTANCE)
        return await allowlists.add(db_session, settings, actor, allowlists.require_list(list_name), data)

    @delete("/allowed-hosts/{list_name:str}/{entry_id:int}", summary="Remove a host an admin allowed")
    async def disallow_host(
        self, db_session: DbSession, actor: ActorDep, list_name: FromPath[str], entry_id: FromPath[int]
    ) -> None:
        require(actor.principal, Action.INSTANCE_ADMIN, INSTANCE)
        await allowlists.remove(db_session, actor, allowlists.require_list(list_name), entry_id)
