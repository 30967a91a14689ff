"""Replicas started together on an empty database each try to create the first admin: one does,
with one password; the others start without error and create nothing."""

import asyncio

import pytest
from sqlalchemy import func, select

from forge.accounts import bootstrap
from forge.core.settings import Settings
from forge.db.engine import Database
from forge.db.models import Account

pytestmark = pytest.mark.db


async def test_replicas_starting_together_create_one_admin(settings: Settings) -> None:
    replicas = [Database(settings.effective_database_url) for _ in range(4)]
    try:
        passwords = await asyncio.gather(*(bootstrap.ensure_admin(db, settings) for db in replicas))
        assert sum(p is not None for p in passwords) == 1, passwords
        async with replicas[0].session() as s:
            assert (await s.execute(select(func.count(Account.id)))).scalar_one() == 1
            root = (await s.execute(select(Account))).scalar_one()
        assert root.login == bootstrap.ADMIN_LOGIN and root.is_admin
        [password] = [p for p in passwords if p]
        assert f"password: {password}" in (settings.data_dir / bootstrap.PASSWORD_FILE).read_text()
    finally:
        for db in replicas:
            await db.dispose()
