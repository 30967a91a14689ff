"""Accounts and tokens made through the real services, and the handle of a served app."""

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

import msgspec

from forge.accounts import accounts, tokens
from forge.core.settings import Settings
from forge.db.audit import Actor
from forge.db.engine import Database
from forge.db.models import Account

PASSWORD = "correct horse battery"
T = TypeVar("T")


class Accounts(msgspec.Struct):
    """Helpers that make accounts and tokens through the real services."""

    db: Database

    async def user(self, login: str, *, admin: bool = False, password: str = PASSWORD) -> Account:
        async with self.db.session(write=True) as s:
            return await accounts.create_user(s, Actor.system("test"), login, password, is_admin=admin)

    async def bot(self, login: str) -> Account:
        async with self.db.session(write=True) as s:
            return await accounts.create_bot(s, Actor.system("test"), login)

    async def token(self, login: str, *scopes: str, expires_days: int | None = None) -> str:
        async with self.db.session(write=True) as s:
            owner = await accounts.require_by_login(s, login)
            created = await tokens.create(s, Actor.system("test"), owner, "test", list(scopes), expires_days)
        return created.token


class LiveServer(msgspec.Struct):
    url: str
    settings: Settings


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine from a synchronous test (each call gets a fresh loop and engine)."""
    return asyncio.run(coro)


async def make_account_with_token(settings: Settings, login: str, *scopes: str, admin: bool = False) -> str:
    database = Database(settings.effective_database_url)
    try:
        helper = Accounts(db=database)
        await helper.user(login, admin=admin)
        return await helper.token(login, *scopes)
    finally:
        await database.dispose()
