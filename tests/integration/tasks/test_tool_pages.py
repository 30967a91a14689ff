"""Custom tools' pages over HTTP (docs/tools.md), no worker and no Docker (a test run's container
is tests/browser/test_tool_pages.py): the task page's card for a call that waits for approval
(the tool, its version, the exact inputs and their hash, who may decide; Approve / Deny posting
to a page route with the form's CSRF token, a second decision refused with why, no buttons for
whoever may not decide, a `tool_run` transcript line that is a line and never a card, an unknown
kind that renders as nothing but facts); and the repository's and the instance's tool pages:
the live schema check, a refused form kept as typed, versions, diff, activate, restore, switch,
a test run's refused inputs, and who gets 403 or 404."""

import html
import re
from datetime import timedelta
from typing import Any

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy import select

from forge.accounts import accounts, tokens
from forge.core.settings import Settings
from forge.db.audit import Actor
from forge.db.engine import Database, utcnow
from tasks.core.models import Task, TranscriptEvent
from tasks.core.tool_models import CustomToolRun
from tasks.core.transcript import Pending, ToolRunEvent
from tests.support.task_world import TASKS, World, build_task_world
from tests.support.transcripts import record
from tests.support.web import csrf_from, sign_in

pytestmark = pytest.mark.db

TOOLS_API = "/api/v1/repos/ana/demo/tools"
TOOLS = "/ana/demo/settings/tools"
PASSWORD = "correct horse battery"
INPUTS = {"pattern": "$(id) <b>"}
HASH = "ab" * 32
RUN_TESTS: dict[str, Any] = {
    "name": "run_tests",
    "description": "Run the tests matching a pattern",
    "parameters": {
        "type": "object",
        "properties": {"pattern": {"type": "string", "maxLength": 200}},
        "required": ["pattern"],
    },
    "script": 'echo "testing $FORGEHAND_ARG_PATTERN"\n',
    "interpreter": "sh",
    "mode": "approval",
    "timeout_seconds": 60,
}


@pytest.fixture
async def world(db: Database, settings: Settings) -> World:
    world = await build_task_world(db, settings)
    async with db.session(write=True) as s:
        wendy = await accounts.require_by_login(s, "wendy")
        scopes = ["repo:read", "tasks:read"]
        world.tokens["wendy-reads"] = (await tokens.create(s, Actor.system("test"), wendy, "r", scopes, None)).token
        root = await accounts.create_user(s, Actor.system("test"), "root", PASSWORD, is_admin=True)
        world.tokens["root"] = (await tokens.create(s, Actor.system("test"), root, "t", ["admin"], None)).token
    return world


def text_of(page: str) -> str:
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", page)).split())


def section(page: str, element_id: str) -> str:
    """The element with this id, up to its closing tag (cards are <section>s)."""
    start = page.index(f'id="{element_id}"')
    return page[start : page.index("</section>", start)]


async def waiting_run(client: AsyncTestClient[Litestar], world: World, db: Database) -> int:
    """A task whose agent called `custom_run_tests`, waiting for a person (no worker here)."""
    r = await client.post(TOOLS_API, json=RUN_TESTS, headers=world.h("ana"))
    assert r.status_code == 201, r.text
    tool_id = r.json()["id"]
    body = {"goal": "Test it", "agent": "fixer", "runtime": "command", "command": "true"}
    assert (await client.post(TASKS, json=body, headers=world.h("ana"))).status_code == 201
    async with db.session(write=True) as s:
        task = (await s.execute(select(Task))).scalars().one()
        row = CustomToolRun(
            tool_id=tool_id, version=1, tool_name="run_tests", repo_id=task.repo_id, task_id=task.id,
            inputs=INPUTS, inputs_hash=HASH, state="awaiting_approval", expires_at=utcnow() + timedelta(hours=1),
        )  # fmt: skip
        s.add(row)
        await s.flush()
        run_id = row.id
    event = ToolRunEvent(
        text="custom_run_tests (version 1) was called; it waits for a person's approval",
        tool_run_id=run_id, tool="run_tests", version=1, state="awaiting_approval", inputs_hash=HASH,
    )  # fmt: skip
    await record(db, 1, [Pending(kind="tool_run", payload=event)])
    return run_id


async def record_approval_lookalike(db: Database, run_id: int) -> None:
    """An event of a kind this page does not know, that looks like something to approve."""
    async with db.session(write=True) as s:
        task = (await s.execute(select(Task))).scalars().one()
        task.last_seq += 1
        payload = {"text": "approve me", "state": "awaiting_approval", "tool_run_id": run_id, "tool": "run_tests"}
        s.add(
            TranscriptEvent(
                task_id=task.id, seq=task.last_seq, run_id=None, at=task.updated_at, kind="tool_approval",
                schema_version=1, payload=payload,
            )
        )  # fmt: skip


async def test_a_waiting_tool_call_gets_a_card_that_decides_it_once(
    client: AsyncTestClient[Litestar], world: World, db: Database
) -> None:
    run_id = await waiting_run(client, world, db)
    await record_approval_lookalike(db, run_id)
    card_id = f"tool-run-{run_id}"
    action = f"/ana/demo/tasks/1/tool-runs/{run_id}"

    # Whoever sees the task but may not decide: the card, without its buttons, saying who may.
    for who in ("wendy-reads", "fixer"):  # a read-only token; the task's own agent
        page = (await client.get("/ana/demo/tasks/1", headers=world.h(who))).text
        card = section(page, card_id)
        assert "waits for your approval" in card and "<button" not in card and "<form" not in card, who
        assert "You cannot decide it" in text_of(card)
        r = await client.post(action, data={"decision": "approve"}, headers=world.h(who), follow_redirects=False)
        assert r.status_code == 403, (who, r.status_code)
    rita = await client.get("/ana/demo/tasks/1", headers={**world.h("rita"), "Accept": "text/html"})
    assert rita.status_code == 404 and card_id not in rita.text  # a read collaborator sees no tasks

    # A person with write access, signed in: the card with what approving runs, and its buttons.
    assert (await sign_in(client, "wendy", PASSWORD)).status_code in (302, 303)
    page = (await client.get("/ana/demo/tasks/1")).text
    assert page.count('class="card approval tool-run-approval"') == 1  # one card: the run, not its events
    card = section(page, card_id)
    shown = text_of(card)
    assert "custom_run_tests (version 1) waits for your approval" in shown
    assert '{ "pattern": "$(id) <b>" }' in shown and "<b>" not in card  # the exact inputs, as text
    assert HASH in shown and "Who may decide: people with write access to ana/demo" in shown
    assert f'action="{action}"' in card
    assert re.search(r'value="approve" aria-label="Approve custom_run_tests \(tool run \d+\)">Approve</button>', card)
    assert 'name="decision" value="deny"' in card
    # The transcript: the run's state change as a line, the unknown kind as facts; neither is a card.
    body = page[page.index('id="transcript"') :]
    line = body[body.index("ti-tool-run") : body.index("</article>", body.index("ti-tool-run"))]
    assert "run-state-awaiting_approval" in line and "awaiting approval" in line and "<form" not in line
    lookalike = body[body.index("ti-generic") : body.index("</article>", body.index("ti-generic"))]
    assert "tool approval" in lookalike and "<form" not in lookalike and "<button" not in lookalike
    assert "waits for your approval" not in body

    # Without the form's CSRF token the session's post is refused, and nothing is decided.
    r = await client.post(action, data={"decision": "approve", "input_hash": HASH}, follow_redirects=False)
    assert r.status_code == 403
    form = {"csrf_token": csrf_from(card), "decision": "approve", "input_hash": HASH, "reason": ""}
    r = await client.post(action, data=form, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/ana/demo/tasks/1", r.text
    read = (await client.get(f"/api/v1/repos/ana/demo/tool-runs/{run_id}", headers=world.h("ana"))).json()
    assert read["state"] == "queued" and read["decided_by"] == "wendy"

    page = (await client.get("/ana/demo/tasks/1")).text
    assert card_id not in page.replace(f"#{card_id}", "")  # decided: no card any more
    assert f"wendy approved the custom_run_tests call (version 1, tool run {run_id})" in text_of(page)
    # A second approval (a stale page): refused, saying why, and the run stays queued.
    r = await client.post(action, data=form, follow_redirects=False)
    assert r.status_code == 409
    alert = text_of(r.text[r.text.index('id="act-error"') :].split("</div>")[0])
    assert f"tool run {run_id} is queued: it no longer waits for a decision" in alert
    read = (await client.get(f"/api/v1/repos/ana/demo/tool-runs/{run_id}", headers=world.h("ana"))).json()
    assert read["state"] == "queued" and read["decided_by"] == "wendy"


async def test_a_repository_admin_makes_changes_and_compares_a_tool_on_its_pages(
    client: AsyncTestClient[Litestar], world: World
) -> None:
    ana = world.h("ana")
    listing = (await client.get(f"{TOOLS}/", headers=ana)).text
    assert 'id="no-tools"' in listing and f'href="{TOOLS}/" aria-current="page">Tools' in listing
    assert 'id="no-instance-tools"' in listing

    # The live check answers what saving would.
    bad = '{"type": "object", "properties": {"o": {"type": "object"}}}'
    check = await client.post(f"{TOOLS}/check-schema", data={"parameters": bad}, headers=ana)
    assert check.status_code == 200 and check.json()["ok"] is False
    assert check.json()["message"].startswith("parameters.properties.o: type 'object' is not allowed")
    good = '{"type": "object", "properties": {"pattern": {"type": "string"}}, "required": ["pattern"]}'
    check = await client.post(f"{TOOLS}/check-schema", data={"parameters": good}, headers=ana)
    assert check.json() == {"ok": True, "message": "Valid: 1 parameter (pattern), 1 required."}

    # A refused schema: the form again, the error at the parameters, everything typed kept.
    form = {"name": "run_tests", "description": "Run them", "parameters": bad, "script": "echo one\r\n"}
    form |= {"interpreter": "bash", "mode": "approval", "timeout_seconds": "60"}
    r = await client.post(f"{TOOLS}/", data=form, headers=ana, follow_redirects=False)
    assert r.status_code == 422, r.text
    assert 'id="parameters-error"' in r.text and 'aria-invalid="true" autofocus' in r.text
    kept = html.unescape(r.text)
    assert bad in kept and 'value="run_tests"' in kept and "echo one" in kept and "Run them" in kept
    assert '<option value="bash" selected>' in r.text
    # `auto` without read-only: refused at the mode.
    r = await client.post(f"{TOOLS}/", data={**form, "parameters": good, "mode": "auto"}, headers=ana)
    assert r.status_code == 422 and 'id="mode-error"' in r.text and "read_only" in r.text

    r = await client.post(f"{TOOLS}/", data={**form, "parameters": good}, headers=ana, follow_redirects=False)
    assert r.status_code == 303, r.text
    url = r.headers["location"].split("?")[0]
    assert "Version 1 is a draft" in (await client.get(r.headers["location"], headers=ana)).text
    r = await client.post(f"{url}/edit", data={**form, "parameters": good, "script": "echo two\n"}, headers=ana)
    assert r.status_code == 200 and "Version 2 made, a draft" in r.text  # followed the redirect
    r = await client.post(f"{url}/edit", data={**form, "parameters": good, "script": "echo two\n"}, headers=ana)
    assert "Nothing changed: no new version was made." in r.text

    diff = (await client.get(f"{url}?old=1&new=2", headers=ana)).text
    script = diff[diff.index('id="diff-script"') :]
    assert '<span class="ddel">-echo one</span>' in script and '<span class="dadd">+echo two</span>' in script
    assert 'id="diff-parameters"' not in diff  # the same parameters

    r = await client.post(f"{url}/activate", data={"version": "2"}, headers=ana)
    assert "Version 2 is active" in r.text and 'id="active-version">2<' in r.text
    r = await client.post(f"{url}/restore", data={"version": "1"}, headers=ana)
    assert "Version 3 restores version 1" in r.text
    tool = (await client.get(f"{TOOLS_API}/{url.rsplit('/', 1)[1]}", headers=ana)).json()
    assert tool["latest_version"] == 3 and tool["active_version"] == 2 and tool["latest"]["script"] == "echo one\n"
    r = await client.post(f"{url}/enabled", data={"enabled": ""}, headers=ana)
    assert "The tool is disabled" in r.text and ">Enable</button>" in r.text

    # A test run's inputs the schema refuses: nothing runs, the inputs kept beside the error.
    r = await client.post(f"{url}/test-run", data={"inputs": '{"patern": "x"}', "version": "3"}, headers=ana)
    assert r.status_code == 422 and 'id="inputs-error"' in r.text
    assert "inputs: unknown parameter 'patern' (this tool takes: pattern)" in html.unescape(r.text)
    assert "{&#34;patern&#34;: &#34;x&#34;}" in r.text and 'id="no-runs"' in r.text

    # Not the repository's admin: 403 (a collaborator) for pages, the check and changes alike.
    for who in ("wendy", "rita"):
        assert (await client.get(f"{TOOLS}/", headers=world.h(who))).status_code == 403
        assert (await client.get(url, headers=world.h(who))).status_code == 403
        r = await client.post(f"{TOOLS}/check-schema", data={"parameters": good}, headers=world.h(who))
        assert r.status_code == 403
        assert (await client.post(f"{url}/activate", data={"version": "1"}, headers=world.h(who))).status_code == 403

    # Signed in, the live check is a page POST like the others: without the session's token, refused.
    assert (await sign_in(client, "ana", PASSWORD)).status_code in (302, 303)
    token = csrf_from((await client.get(f"{TOOLS}/new")).text.split('id="tool-form"')[1])
    assert (await client.post(f"{TOOLS}/check-schema", data={"parameters": good})).status_code == 403
    r = await client.post(f"{TOOLS}/check-schema", data={"parameters": good}, headers={"X-CSRF-Token": token})
    assert r.status_code == 200 and r.json()["ok"] is True


async def test_instance_tools_on_the_admin_pages_and_as_a_repository_is_offered_them(
    client: AsyncTestClient[Litestar], world: World
) -> None:
    root = world.h("root")
    form = {"name": "lookup", "parameters": "", "script": "echo hi\n", "mode": "approval", "timeout_seconds": "60"}
    r = await client.post("/admin/tools/", data=form, headers=root, follow_redirects=False)
    assert r.status_code == 303, r.text
    url = r.headers["location"].split("?")[0]
    page = (await client.post(f"{url}/activate", data={"version": "1"}, headers=root)).text
    assert 'aria-current="page">Tools' in page and 'id="active-version">1<' in page
    assert (await client.get("/admin/tools/", headers=world.h("ana"))).status_code == 403

    offered = (await client.get(f"{TOOLS}/", headers=world.h("ana"))).text
    instance = offered[offered.index('id="instance-tools"') :]
    assert "custom_lookup" in instance and "shadowed" not in instance
    r = await client.post(TOOLS_API, json={**RUN_TESTS, "name": "lookup"}, headers=world.h("ana"))
    own = r.json()["id"]
    await client.post(f"{TOOLS_API}/{own}/activate", json={"version": 1}, headers=world.h("ana"))
    offered = (await client.get(f"{TOOLS}/", headers=world.h("ana"))).text
    instance = text_of(offered[offered.index('id="instance-tools"') :])
    assert "custom_lookup — — no: shadowed by this repository's custom_lookup" in instance

    # The task start form says what an agent here will be offered.
    start = (await client.get("/ana/demo/tasks/", headers=world.h("wendy"))).text
    offered_tools = text_of(start[start.index('id="agent-tools"') :])
    assert "Custom tools the agent is offered here (1)" in offered_tools
    assert "custom_lookup (version 1, repository, replaces the instance's tool of that name)" in offered_tools
