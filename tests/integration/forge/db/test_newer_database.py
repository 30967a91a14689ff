"""A database a newer release migrated (a revision this release does not know): `serve`'s upgrade
leaves it as it is with a warning, so a replica of the previous release that restarts during a
rolling upgrade serves again instead of failing to start; the commands that need the schema say
to run the newer release's forgehand (not `db upgrade`, which this release cannot do)."""

import click
import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy import text
from structlog.testing import capture_logs

from forge.app.commands.context import require_migrated
from forge.db.engine import Database
from forge.db.migrate import head_revision, upgrade_async

pytestmark = pytest.mark.db

NEWER = "9001"


async def test_a_database_of_a_newer_release_is_served_as_it_is(
    db: Database, db_url: str, client: AsyncTestClient[Litestar]
) -> None:
    async with db.session(write=True) as s:
        await s.execute(text("UPDATE alembic_version SET version_num = :v"), {"v": NEWER})
    with capture_logs() as logs:
        await upgrade_async(db_url)  # what `serve` and `worker` do at start: no error
    [warned] = [e for e in logs if "migrated by a newer forgehand" in e["event"]]
    assert warned["database_revision"] == NEWER and warned["this_release_head"] == head_revision()
    async with db.session() as s:  # nothing was changed
        assert (await s.execute(text("SELECT version_num FROM alembic_version"))).scalar_one() == NEWER
    assert (await client.get("/healthz")).json()["status"] == "ok"

    with pytest.raises(click.ClickException) as refused:
        await require_migrated(db)
    assert "a newer forgehand made" in refused.value.message and "newer release's forgehand" in refused.value.message
