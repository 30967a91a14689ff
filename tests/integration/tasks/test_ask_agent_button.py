"""A pull request's "Ask an agent" button, as a person uses it: it opens the task form on that
pull request (the notice names it, the form carries its number), and the form's start makes a
task that works from the pull request's head branch, linked to it."""

import re
from typing import Any

from litestar.testing import AsyncTestClient

from forge.core.settings import Settings
from forge.db.engine import Database
from tests.support.task_world import TASKS, build_task_world, open_login_pull
from tests.support.web import csrf_from, sign_in

API = "/api/v1/repos/ana/demo"


async def test_the_ask_an_agent_button_starts_a_task_on_the_pull_requests_head(
    client: AsyncTestClient[Any], db: Database, settings: Settings
) -> None:
    world = await build_task_world(db, settings)
    await open_login_pull(client, world)

    await sign_in(client, "wendy", "correct horse battery")
    page = (await client.get("/ana/demo/pull/1")).text
    button = re.search(r'<a class="button" id="ask-agent" href="([^"]+)">', page)
    assert button is not None, page
    form_page = (await client.get(button.group(1).replace("&amp;", "&"))).text
    assert 'id="on-pull-request"' in form_page and 'href="/ana/demo/pull/1">pull request #1</a>' in form_page
    assert '<input type="hidden" name="on_pull_request" value="1">' in form_page

    form = form_page[form_page.index('id="start-form"') :]
    started = await client.post(
        "/ana/demo/tasks/",
        data={
            "csrf_token": csrf_from(form),
            "on_pull_request": "1",
            "goal": "Write the tests for login",
            "agent": "fixer",
            "runtime": "command",
            "command": "true",
        },
        follow_redirects=False,
    )
    assert started.status_code == 303, started.text
    assert started.headers["location"] == "/ana/demo/tasks/1"
    task = (await client.get(f"{TASKS}/1", headers=world.h("wendy"))).json()
    assert task["base"] == "feature/login" and task["on_pull_request"]["number"] == 1
    assert task["started_by"] == "wendy" and task["state"] == "queued"
