"""Dependencies shared by API routes and web pages (Litestar `Provide`)."""

from collections.abc import AsyncGenerator
from typing import Any

from litestar import Request
from litestar.datastructures import State
from litestar.di import NamedDependency, Provide
from sqlalchemy.ext.asyncio import AsyncSession

from forge.access import Principal
from forge.audit import Actor
from forge.auth import actor_of
from forge.db import Database
from forge.events import EventBus
from forge.git import RepoStore
from forge.settings import Settings
from forge.tokens import TokenCache

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


async def provide_db_session(request: Request[Any, Any, Any], state: State) -> AsyncGenerator[AsyncSession, None]:
    """One transaction per request: it commits when the handler returns and rolls back on error.
    Unsafe methods take SQLite's write lock up front."""
    db: Database = state.db
    # git's POSTs (fetch negotiation, pushes) only read here; pushes record their refs later.
    write = request.method not in SAFE_METHODS and not request.route_handler.opt.get("git")
    async with db.session(write=write) as session:
        yield session


def provide_actor(request: Request[Any, Any, Any]) -> Actor:
    return actor_of(request)


def provide_principal(request: Request[Any, Any, Any]) -> Principal:
    return actor_of(request).principal


def provide_settings(state: State) -> Settings:
    settings: Settings = state.settings
    return settings


def provide_db(state: State) -> Database:
    db: Database = state.db
    return db


def provide_token_cache(state: State) -> TokenCache:
    cache: TokenCache = state.auth.token_cache
    return cache


DEPENDENCIES = {
    "db_session": Provide(provide_db_session),
    "actor": Provide(provide_actor, sync_to_thread=False),
    "principal": Provide(provide_principal, sync_to_thread=False),
    "settings": Provide(provide_settings, sync_to_thread=False),
    "db": Provide(provide_db, sync_to_thread=False),
    "token_cache": Provide(provide_token_cache, sync_to_thread=False),
}

# Explicit markers for handler parameters (inferred dependencies go away in Litestar 3).
DbSession = NamedDependency[AsyncSession]
ActorDep = NamedDependency[Actor]
PrincipalDep = NamedDependency[Principal]
SettingsDep = NamedDependency[Settings]
DatabaseDep = NamedDependency[Database]
TokenCacheDep = NamedDependency[TokenCache]


def provide_store(state: State) -> RepoStore:
    store: RepoStore = state.repo_store
    return store


def provide_bus(state: State) -> EventBus:
    bus: EventBus = state.bus
    return bus


DEPENDENCIES["store"] = Provide(provide_store, sync_to_thread=False)
DEPENDENCIES["bus"] = Provide(provide_bus, sync_to_thread=False)
StoreDep = NamedDependency[RepoStore]
BusDep = NamedDependency[EventBus]
