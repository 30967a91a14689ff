"""Settings > Schedules in the browser, without a browser: the list with the next run, a schedule
added, a refused form shown again as typed with the error beside its field, a schedule changed,
paused and deleted; writers are refused."""

from typing import Any

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient

from forge.core.settings import Settings
from forge.db.engine import Database
from tests.support.forms import read_form
from tests.support.task_world import World, build_task_world
from tests.support.web import csrf_from, sign_in

pytestmark = pytest.mark.db

PAGE = "/ana/demo/settings/schedules/"
FIELDS = {
    "name": "nightly",
    "cron": "0 3 * * *",
    "timezone": "Europe/Berlin",
    "goal": "Update the dependencies",
    "agent": "fixer",
    "runtime": "command",
    "command": "make update",
    "base": "",
    "title": "",
}


@pytest.fixture
async def world(db: Database, settings: Settings) -> World:
    return await build_task_world(db, settings)


async def post(client: AsyncTestClient[Litestar], path: str, fields: dict[str, Any]) -> Any:
    token = csrf_from((await client.get(PAGE)).text)
    return await client.post(path, data={**fields, "csrf_token": token}, follow_redirects=False)


async def test_add_change_pause_and_delete_a_schedule(client: AsyncTestClient[Litestar], world: World) -> None:
    await sign_in(client, "ana", "correct horse battery")
    empty = await client.get(PAGE)
    assert empty.status_code == 200 and 'id="no-schedules"' in empty.text
    assert 'href="/ana/demo/settings/schedules/" aria-current="page"' in empty.text  # the settings nav

    r = await post(client, PAGE, FIELDS)
    assert r.status_code in (302, 303), r.text
    one = r.headers["location"]
    assert one.startswith(PAGE)
    shown = read_form((await client.get(one)).text)
    assert shown.value("cron") == "0 3 * * *" and shown.value("agent") == "fixer"
    assert shown.value("command") == "make update"

    listed = await client.get(PAGE)
    assert "nightly" in listed.text and "Europe/Berlin" in listed.text and "UTC</time>" in listed.text

    saved = await post(client, one, {**FIELDS, "cron": "30 4 * * 1-5", "paused": "1"})
    assert saved.status_code == 200 and "Saved." in saved.text
    assert read_form(saved.text).value("cron") == "30 4 * * 1-5"
    assert "Next run: paused" in saved.text

    gone = await post(client, f"{one}/delete", {})
    assert gone.status_code in (302, 303) and gone.headers["location"] == PAGE
    assert 'id="no-schedules"' in (await client.get(PAGE)).text


async def test_a_refused_form_comes_back_as_typed_with_the_error_beside_its_field(
    client: AsyncTestClient[Litestar], world: World
) -> None:
    await sign_in(client, "ana", "correct horse battery")
    for field, value, words in (
        ("cron", "every night", "5 fields"),
        ("timezone", "Mars/Base", "not an IANA time zone"),
        ("base", "nope", "does not exist"),
    ):
        r = await post(client, PAGE, {**FIELDS, field: value})
        assert r.status_code == 422, r.text
        form = read_form(r.text)
        assert form.value(field) == value and form.value("goal") == FIELDS["goal"]
        assert words in form.error_of(field), (field, form.error_of(field))


async def test_writers_cannot_see_the_schedules(client: AsyncTestClient[Litestar], world: World) -> None:
    await sign_in(client, "wendy", "correct horse battery")
    assert (await client.get(PAGE)).status_code == 403
