"""An agent asked to work on a person's pull request proposes its result as a pull request of its
own into that pull request's head branch (stacked), and the two are linked both ways: the
original's conversation names the stacked one, the task page and JSON name the task's pull
request, and its description names the original."""

import re
from typing import Any

from litestar.testing import AsyncTestClient

from forge.core.settings import Settings
from forge.db.engine import Database
from forge.git import Identity
from tests.support.task_world import TASKS, agent_commits, build_task_world, open_login_pull, open_task_pull
from tests.support.web import sign_in

API = "/api/v1/repos/ana/demo"
ANA = Identity(name="Ana", email="ana@example.org")
URL = "http://testserver.local"


async def test_an_agents_work_on_a_pull_request_is_stacked_on_it_and_linked(
    client: AsyncTestClient[Any], db: Database, settings: Settings
) -> None:
    world = await build_task_world(db, settings)
    await open_login_pull(client, world)

    # wendy asks the agent to work on #1; its run ends with a commit and settles in review
    start = {"goal": "Write the tests for login", "agent": "fixer", "command": "true", "on_pull_request": 1}
    r = await client.post(TASKS, json=start, headers=world.h("wendy"))
    assert r.status_code == 201, r.text
    assert r.json()["base"] == "feature/login"
    await agent_commits(db, settings, 1, {"test_login.py": b"def test_login():\n    pass\n"}, "tests for login")
    assert await open_task_pull(db, settings, URL) == 2

    # the task's pull request #2 is stacked on #1: its base is #1's head branch
    original = (await client.get(f"{API}/pulls/1", headers=world.h("ana"))).json()
    stacked = (await client.get(f"{API}/pulls/2", headers=world.h("ana"))).json()
    assert stacked["base"]["ref"] == original["head"]["ref"] == "feature/login"
    assert stacked["head"]["ref"].startswith("agent/1-") and stacked["user"]["login"] == "fixer"
    assert "It goes into `feature/login`, the head branch of #1." in stacked["body"]
    task = (await client.get(f"{TASKS}/1", headers=world.h("wendy"))).json()
    assert task["pull_request"] == {"number": 2, "html_url": f"{URL}/ana/demo/pull/2"}
    assert task["on_pull_request"]["number"] == 1

    await sign_in(client, "wendy", "correct horse battery")
    # #1's conversation: wendy's comment linking the task, then the stacked pull request, linked
    conversation = (await client.get("/ana/demo/pull/1")).text
    event = re.search(r'<p class="event muted" id="stacked-2">.*?</p>', conversation, re.S)
    assert event is not None, conversation
    assert '<strong>fixer</strong> opened <a href="/ana/demo/pull/2">#2 ' in event.group(0)
    assert "into <code>feature/login</code>" in event.group(0) and ">open</span>" in event.group(0)
    assert conversation.index(f'href="{URL}/ana/demo/tasks/1"') < conversation.index('id="stacked-2"')
    # #2's conversation names no pull request stacked on it; #1 is not stacked on main's pull requests
    assert 'id="stacked-' not in (await client.get("/ana/demo/pull/2")).text

    # the task page links its pull request
    page = (await client.get("/ana/demo/tasks/1")).text
    link = re.search(r'<a href="([^"]+)" id="task-pull-request">([^<]+)</a>', page)
    assert link is not None and link.groups() == ("/ana/demo/pull/2", "Pull request #2")
    assert (await client.get(link.group(1))).status_code == 200
