"""The task pages over HTTP (no worker): the transcript timeline of every kind of event, its live
fragment, the run filter, the header's "waiting for", the start form's choices and refusals, the
`merged` filter, and what a read collaborator is answered. Real database, real git, real app."""

import html
import json
import re
from typing import Any

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient
from markupsafe import escape
from sqlalchemy import select

from forge.core.settings import Settings
from forge.db.engine import Database
from tasks.core.schemas import GOAL_MAX
from tasks.http.pages.timeline_items import short_name
from tests.support.forms import read_form
from tests.support.task_world import TASKS, World, agent_commits, build_task_world
from tests.support.transcripts import (
    ASK_REASON,
    CLAUDE_HELD,
    COMMAND,
    CONTAINER,
    PARKED_ID,
    WRITTEN,
    ask,
    park,
    record,
    record_unknown_kind,
)
from tests.support.web import csrf_from

pytestmark = pytest.mark.db

PAGE = "/ana/demo/tasks"


@pytest.fixture
async def world(db: Database, settings: Settings) -> World:
    return await build_task_world(db, settings)


async def start(client: AsyncTestClient[Litestar], world: World, **kw: Any) -> dict[str, Any]:
    body = {"goal": "greet", "agent": "fixer", "command": "true", "title": "Greet", **kw}
    r = await client.post(TASKS, json=body, headers=world.h("ana"))
    assert r.status_code == 201, r.text
    return dict(r.json())


def text_of(page: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", page))


async def test_the_timeline_shows_each_kind_as_written(
    client: AsyncTestClient[Litestar], world: World, db: Database
) -> None:
    await start(client, world)
    await record(db, 1)
    await record_unknown_kind(db, 1)
    r = await client.get(f"{PAGE}/1", headers=world.h("wendy"))
    assert r.status_code == 200, r.text
    page = r.text
    body = page[page.index('id="transcript"') :]
    # The command as the command: no JSON quoting or escapes.
    shown = html.unescape(body)
    assert COMMAND in shown and json.dumps(COMMAND) not in shown
    # The written file as its content, the edit as a diff.
    assert WRITTEN in shown and json.dumps(WRITTEN) not in shown
    assert '<span class="ddel">-two</span>' in body and '<span class="dadd">+TWO</span>' in body
    # The shell result as its exit status (not "result: bash"), stdout and stderr as separate blocks.
    assert 'class="badge outcome-ok">exit code 0</span>' in body and "result: bash" not in body
    assert body.count('data-stream="stdout"') == 2 and body.count('data-stream="stderr"') == 1
    assert "line one\n</span><span" in body  # two chunks of one stream, one block
    assert "Show all (60 lines)" in body  # the long output folds
    # Markdown, sanitised; the prompt verbatim.
    assert "<strong>fix</strong>" in body and "<script>" not in body and "onerror" not in body
    assert "Fix the <b>greeting</b>\n> quoted" in shown and "<b>greeting" not in body
    # Phases folded into one line with their durations; the policy decision with its reason.
    assert body.count("ti-phases") == 2
    assert "420 ms" in body and "2.3 s" in body
    assert "Reason: no network tools here" in body and "http://127.0.0.1:9/policy" in body
    assert "greet.py</code></li>" in body  # the snapshot's changed files
    # An unknown kind, generically, without its empty fields.
    generic = text_of(body[body.index("ti-generic") :])
    assert "cache report" in generic and "hits 1200" in generic and "evicted" not in generic and "note" not in generic
    # Tool results sit in their calls' cards.
    assert body.count("ti-result") == 0 and body.count("ti-tool") == 4


async def test_the_reviewer_sees_each_call_between_its_decisions_and_plumbing_in_one_line(
    client: AsyncTestClient[Litestar], world: World, db: Database
) -> None:
    await start(client, world)
    await record(db, 1)
    page = (await client.get(f"{PAGE}/1", headers=world.h("wendy"))).text
    body = page[page.index('id="transcript"') :]
    # The bash call: its pre_tool_use decision before it, its exit status, then its post_tool_use.
    bash = card(page, "c1")
    assert bash.index("pre_tool_use") < bash.index("bash") < bash.index("exit code 0") < bash.index("post_tool_use")
    # A decision recorded without the call's id (older records) still sits with the call it decided.
    fetch = card(page, "c4")
    assert fetch.index("pre_tool_use") < fetch.index("web_fetch") < fetch.index("error")
    assert "Reason: no network tools here" in fetch and 'class="ti ev ev-system ti-policy' not in body
    # Other calls say ok (or error), not "result: <tool>".
    assert 'outcome-ok">ok</span>' in raw_card(page, "c2") and 'outcome-error">error</span>' in raw_card(page, "c4")
    assert "result:" not in body
    # A model call: one line, no empty fields (`ttfb ms null`, an empty `error`).
    model = text_of(body[body.index("ti-model") : body.index("</details>", body.index("ti-model"))])
    assert "Model call: claude-test · 1,200 in / 80 out · 850 ms" in model
    assert "ttfb" not in model and "error" not in model and "null" not in model
    # The sandbox's long container name: shortened in its phase, the whole name on demand.
    phases = text_of(body[body.index("ti-phases") : body.index("</details>\n", body.index("phase-list"))])
    assert f"sandbox {short_name(CONTAINER)} started" in phases and len(short_name(CONTAINER)) < 40
    # Each item's icon refers to the page's one definition of it, and each one it refers to is there.
    defined = set(re.findall(r'<symbol id="(i-[a-z]+)"', page))
    used = set(re.findall(r'<use href="#(i-[a-z]+)"', body))
    assert used and used <= defined and page.count("<symbol ") == len(defined)
    assert "<path" not in body[: body.index('id="new-events"')]  # no icon drawn again inside the transcript


async def test_the_live_fragment_and_the_run_filter(
    client: AsyncTestClient[Litestar], world: World, db: Database
) -> None:
    await start(client, world)
    first = await record(db, 1)
    r = await client.get(f"{PAGE}/1/timeline?after={first - 2}", headers=world.h("wendy"))
    assert r.status_code == 200 and r.headers["x-last-seq"] == str(first) and r.headers["x-more"] == "no"
    assert r.text.count('class="ti ') == 2 and "snapshot" in r.text and "Fixed the" in r.text
    assert "<html" not in r.text  # a fragment, not a page
    assert '<use href="#i-summary"/>' in r.text and "<symbol" not in r.text  # the page's icons, referred to
    # A result whose call was sent earlier comes on its own, naming its call (the page moves it in).
    after_call = first - 25 + 7  # `every_kind` has 25 events; the 7th is bash call c1, then its result
    alone = await client.get(f"{PAGE}/1/timeline?after={after_call}", headers=world.h("wendy"))
    assert alone.text.count('data-result-for="c1"') == 1 and 'data-tool-id="c1"' not in alone.text
    # Its policy decisions too, saying where they go (before the call, after its outcome).
    assert 'data-policy-for="c1" data-policy-at="before"' in alone.text
    assert 'data-policy-for="c1" data-policy-at="after"' in alone.text
    empty = await client.get(f"{PAGE}/1/timeline?after={first}", headers=world.h("wendy"))
    assert empty.headers["x-last-seq"] == str(first) and 'class="ti' not in empty.text
    # Run 2 has no events: the filter shows none, the run list offers both runs.
    only2 = await client.get(f"{PAGE}/1?run=2", headers=world.h("wendy"))
    assert only2.status_code == 200 and 'class="ti ' not in only2.text
    only1 = await client.get(f"{PAGE}/1?run=1", headers=world.h("wendy"))
    assert 'value="1" selected' in only1.text and "Fixed the" in only1.text


def raw_card(page: str, tool_id: str) -> str:
    """The HTML of the tool call card of `tool_id` on a task page."""
    start = page.index(f'data-tool-id="{tool_id}"')
    return page[start : page.index("</article>", start)]


def card(page: str, tool_id: str) -> str:
    """The text of the tool call card of `tool_id` on a task page."""
    return text_of(raw_card(page, tool_id))


async def test_a_parked_call_waits_for_approval_and_then_says_who_decided(
    client: AsyncTestClient[Litestar], world: World, db: Database
) -> None:
    await start(client, world)
    approval = await park(db, 1)
    waiting = card((await client.get(f"{PAGE}/1", headers=world.h("wendy"))).text, PARKED_ID)
    # A pause, not a failure: no error badge, no "STOP" quoted as the call's result.
    assert "waiting for your approval" in waiting and f"Reason: {ASK_REASON}" in waiting
    assert "error" not in waiting and "result: Bash" not in waiting
    assert "what the agent was told" in waiting  # Claude Code's words stay available, folded
    r = await client.post(f"{TASKS}/1/approvals/{approval}", json={"decision": "approve"}, headers=world.h("wendy"))
    assert r.status_code == 200, r.text
    decided = card((await client.get(f"{PAGE}/1", headers=world.h("wendy"))).text, PARKED_ID)
    assert "approved by wendy" in decided and "waiting for" not in decided and "error" not in decided


async def test_a_denied_call_says_who_denied_it_and_why(
    client: AsyncTestClient[Litestar], world: World, db: Database
) -> None:
    await start(client, world)
    approval = await park(db, 1)
    body = {"decision": "deny", "reason": "not on main"}
    r = await client.post(f"{TASKS}/1/approvals/{approval}", json=body, headers=world.h("olga"))
    assert r.status_code == 200, r.text
    denied = card((await client.get(f"{PAGE}/1", headers=world.h("wendy"))).text, PARKED_ID)
    assert "denied by olga" in denied and "Reason: not on main" in denied and "error" not in denied


async def test_a_question_is_a_question_for_you_and_then_answered(
    client: AsyncTestClient[Litestar], world: World, db: Database
) -> None:
    await start(client, world)
    await ask(db, 1)
    page = (await client.get(f"{PAGE}/1", headers=world.h("ana"))).text
    asked = card(page, "toolu_01Ask")
    assert "question for you" in asked and "The agent asks: Which colour?" in asked
    assert "red" in asked and "blue" in asked
    assert "error" not in asked and CLAUDE_HELD not in text_of(page[: page.index('id="transcript"')])
    assert page.count('class="ti ev ev-question') == 0  # shown in the call that asked, once
    r = await client.post(f"{TASKS}/1/answer", json={"body": "blue"}, headers=world.h("ana"))
    assert r.status_code == 200, r.text
    answered = card((await client.get(f"{PAGE}/1", headers=world.h("ana"))).text, "toolu_01Ask")
    assert "answered by ana" in answered and "question for you" not in answered


async def test_the_header_says_what_waits_for_whom(
    client: AsyncTestClient[Litestar], world: World, db: Database, settings: Settings
) -> None:
    await start(client, world)
    queued = (await client.get(f"{PAGE}/1", headers=world.h("wendy"))).text
    assert "Waiting for a worker (#1 in the queue)." in queued
    # The badge says the same state as the line (and the live page changes both together).
    assert '<span class="badge state-queued" data-state="queued">queued · #1 in queue</span>' in queued
    assert 'data-when-running="The agent is working;' in queued
    # A command task never calls a model: no usage line at all.
    assert 'id="usage"' not in queued and "model calls" not in queued
    await agent_commits(db, settings, 1, {"hello.txt": b"hi\n"}, "greet")
    review = text_of((await client.get(f"{PAGE}/1", headers=world.h("wendy"))).text)
    assert "Waiting for your review" in review
    bot = text_of((await client.get(f"{PAGE}/1", headers=world.h("fixer"))).text)
    assert "Waiting for review by someone with write access." in bot  # the agent never reviews itself


async def test_the_header_keeps_a_commands_lines_and_renders_the_summarys_code(
    client: AsyncTestClient[Litestar], world: World, db: Database
) -> None:
    from tasks.core.models import Task

    script = "printf 'hi\\n' > hi.txt\nfor i in 1 2; do echo $i; done"
    await start(client, world, command=script)
    async with db.session(write=True) as s:
        task = (await s.execute(select(Task).where(Task.number == 1))).scalar_one()
        task.summary, task.state = "Renamed `greet` to `hello`.<script>alert(1)</script>", "merged"
        task.merged_sha = task.base_sha
    page = (await client.get(f"{PAGE}/1", headers=world.h("wendy"))).text
    # The command as written, its lines kept (a block, not a one-line code span).
    assert f'<pre class="command" id="command"><code>{escape(script)}</code></pre>' in page
    # The summary's code as code, no backtick left over.
    summary = page[page.index('id="summary"') : page.index("</dd>", page.index('id="summary"'))]
    assert "<code>greet</code>" in summary and "<code>hello</code>" in summary and "`" not in summary
    assert "<script" not in summary and "alert(1)" not in summary  # sanitised as the agent's markdown is
    # A merged command task says nothing about model calls.
    assert 'id="usage"' not in page and "model calls" not in page


async def test_a_task_that_changed_nothing_offers_no_merge(
    client: AsyncTestClient[Litestar], world: World, db: Database
) -> None:
    from sqlalchemy import select

    from tasks.core.models import Task

    await start(client, world)
    async with db.session(write=True) as s:
        task = (await s.execute(select(Task).where(Task.number == 1))).scalar_one()
        task.head_sha, task.state = task.base_sha, "awaiting_review"
    page = text_of((await client.get(f"{PAGE}/1", headers=world.h("wendy"))).text)
    assert "No changes: the agent's runs changed nothing." in page and "(not created: no changes yet)" in page
    review = (await client.get(f"{PAGE}/1/review", headers=world.h("wendy"))).text
    assert 'id="merge-form"' not in review and "nothing to merge" in review
    r = await client.post(f"{TASKS}/1/merge", json={}, headers=world.h("wendy"))
    assert r.status_code == 409 and r.json()["code"] == "task_no_changes", r.text
    listed = (await client.get(f"{PAGE}/", headers=world.h("wendy"))).text
    assert "no changes</span>" in listed
    # Its state says what it is (finished, with nothing to review), not "awaiting review"; the API
    # keeps the state's name.
    table = text_of(listed[listed.index('id="task-list"') : listed.index("</table>")])
    for shown in (page, table):
        assert "finished, no changes" in shown and "awaiting review" not in shown
    assert (await client.get(f"{TASKS}/1", headers=world.h("wendy"))).json()["state"] == "awaiting_review"


async def test_the_start_form_offers_the_bots_and_runtimes_and_keeps_a_refused_goal(
    client: AsyncTestClient[Litestar], world: World
) -> None:
    page = (await client.get(f"{PAGE}/", headers=world.h("ana"))).text
    form = page[page.index('id="start-form"') :]
    # Bots with write access only (fixer); people are never offered.
    assert re.findall(r'<option value="([^"]+)"', form[: form.index('id="field-runtime"')]) == ["fixer"]
    runtimes = read_form(page)
    # No model anywhere: the agents are offered disabled, saying why; the command runtime is chosen.
    assert "disabled" in runtimes["runtime-builtin"].attrs and "disabled" not in runtimes["runtime-command"].attrs
    assert ("runtime", "command") in runtimes.checked
    why = " ".join(runtimes["runtime-builtin-why"].text.split())
    assert why.startswith("Cannot run here: It needs an OpenAI-compatible model, and none is set up here for you.")
    assert "Set an endpoint in the task settings" in why  # ana is the repository's admin
    assert "20,000 characters" in form
    long_goal = "x" * (GOAL_MAX + 1)
    data = {
        "goal": long_goal,
        "agent": "fixer",
        "runtime": "command",
        "command": "echo one\r\necho two",
        "csrf_token": csrf_from(page),
    }
    r = await client.post(f"{PAGE}/", data=data, headers=world.h("ana"), follow_redirects=False)
    assert r.status_code == 422, r.text
    assert "length &lt;= 20000" in r.text and 'role="alert"' in r.text
    assert long_goal in r.text and "echo one" in r.text and "echo two" in r.text  # the form is kept, whole
    api = await client.post(
        TASKS, json={"goal": long_goal, "agent": "fixer", "command": "true"}, headers=world.h("ana")
    )
    assert api.status_code == 422 and "length <= 20000" in api.text
    # A multi-line command reaches the task as typed (LF line breaks, not CRLF).
    ok = await client.post(
        f"{PAGE}/", data={**data, "goal": "two lines"}, headers=world.h("ana"), follow_redirects=False
    )
    assert ok.status_code == 303, ok.text
    task = (await client.get(f"{TASKS}/1", headers=world.h("ana"))).json()
    assert task["command"] == "echo one\necho two"


async def test_the_merged_filter(
    client: AsyncTestClient[Litestar], world: World, db: Database, settings: Settings
) -> None:
    await start(client, world)
    await start(client, world, title="Other")
    await agent_commits(db, settings, 1, {"hello.txt": b"hi\n"}, "greet")
    r = await client.post(f"{TASKS}/1/reviews", json={"verdict": "approve"}, headers=world.h("wendy"))
    assert r.status_code == 201, r.text
    r = await client.post(f"{TASKS}/1/merge", json={}, headers=world.h("wendy"))
    assert r.status_code == 200, r.text
    merged = (await client.get(f"{PAGE}/?state=merged", headers=world.h("wendy"))).text
    rows = merged[merged.index('id="task-list"') :]
    assert "Greet" in rows and "Other" not in rows and 'aria-current="page">merged' in merged
    # The merged task's diff stays visible on its review page.
    review = (await client.get(f"{PAGE}/1/review", headers=world.h("wendy"))).text
    assert 'data-path="hello.txt"' in review and 'id="merged"' in review


async def test_a_read_collaborator_gets_404_for_tasks_as_over_rest(
    client: AsyncTestClient[Litestar], world: World
) -> None:
    """Below the write role tasks do not exist for the caller, on pages as over REST; the page says
    why without telling a task that exists from one that does not."""
    await start(client, world)
    pages = [await client.get(f"{PAGE}/{n}", headers={**world.h("rita"), "Accept": "text/html"}) for n in (1, 99)]
    assert [p.status_code for p in pages] == [404, 404]
    assert "collaborators with write access" in pages[0].text
    listing = await client.get(f"{PAGE}/", headers={**world.h("rita"), "Accept": "text/html"})
    assert listing.status_code == 404 and "collaborators with write access" in listing.text
    assert (await client.get(f"{TASKS}/1", headers=world.h("rita"))).status_code == 404
    assert (
        await client.get("/ana/nothing/tasks/1", headers={**world.h("rita"), "Accept": "text/html"})
    ).status_code == 404


async def test_the_dashboard_lists_what_awaits_my_review(
    client: AsyncTestClient[Litestar], world: World, db: Database, settings: Settings
) -> None:
    await start(client, world)
    await start(client, world, title="Unchanged")
    await agent_commits(db, settings, 1, {"hello.txt": b"hi\n"}, "greet")
    dash = (await client.get("/", headers={**world.h("wendy"), "Accept": "text/html"})).text
    assert 'hx-get="/tasks/awaiting-review"' in dash and 'href="/tasks/awaiting-review"' in dash
    part = await client.get("/tasks/awaiting-review", headers={**world.h("wendy"), "HX-Request": "true"})
    assert part.status_code == 200 and "<html" not in part.text
    assert "ana/demo#1 Greet" in part.text and "Unchanged" not in part.text
    # The agent is never asked to review its own work; once reviewed, it leaves the list.
    assert "ana/demo#1" not in (await client.get("/tasks/awaiting-review", headers=world.h("fixer"))).text
    r = await client.post(f"{TASKS}/1/reviews", json={"verdict": "approve"}, headers=world.h("wendy"))
    assert r.status_code == 201
    full = await client.get("/tasks/awaiting-review", headers=world.h("wendy"))
    assert "<html" in full.text and "Nothing awaits your review." in full.text
    assert "ana/demo#1 Greet" in (await client.get("/tasks/awaiting-review", headers=world.h("olga"))).text


async def test_the_merge_rules_page_warns_when_one_bot_could_merge_its_own_task(
    client: AsyncTestClient[Litestar], world: World, db: Database
) -> None:
    from forge.accounts import accounts
    from forge.db.models import Repository
    from forge.repos import collaborators, repositories
    from tests.support.task_world import SYSTEM

    page = (await client.get("/ana/demo/settings/tasks/", headers=world.h("ana"))).text
    assert 'id="self-merge-warning"' not in page  # one bot: it never reviews its own work
    async with db.session(write=True) as s:
        await accounts.create_bot(s, SYSTEM, "helper")
        repo = (await s.execute(select(Repository).where(Repository.name == "demo"))).scalar_one()
        res = await repositories.resource_for(s, repo, SYSTEM.principal)
        await collaborators.set_collaborator(s, SYSTEM, res, "helper", "write")
    page = (await client.get("/ana/demo/settings/tasks/", headers=world.h("ana"))).text
    assert 'id="self-merge-warning"' in page and "could start a task for" in page
    token = csrf_from(page[page.index('id="task-settings"') :])
    form = {"csrf_token": token, "required_approvals": "1", "approval_not_by_starter": "1"}
    r = await client.post("/ana/demo/settings/tasks/", data=form, headers=world.h("ana"))
    assert r.status_code == 200 and "Saved." in r.text and 'id="self-merge-warning"' not in r.text


async def test_a_stopped_task_says_what_became_of_its_queued_message(
    client: AsyncTestClient[Litestar], world: World
) -> None:
    await start(client, world)
    r = await client.post(f"{TASKS}/1/messages", json={"body": "also add a README"}, headers=world.h("ana"))
    assert r.status_code == 200 and r.json()["queued_message"] == "also add a README", r.text
    page = text_of((await client.get(f"{PAGE}/1", headers=world.h("ana"))).text)
    assert "also add a README (delivered as the next run when this one ends)" in page
    r = await client.post(f"{TASKS}/1/stop", headers=world.h("ana"))
    assert r.status_code in (200, 202), r.text
    stopped = (await client.get(f"{TASKS}/1", headers=world.h("ana"))).json()
    assert stopped["state"] == "stopped" and stopped["queued_message"] == ""
    page = text_of((await client.get(f"{PAGE}/1", headers=world.h("ana"))).text)
    assert "the queued message was not delivered to the agent (retry, then send it again): also add a README" in page
    assert "Stopped: retry it or close it." in page


async def test_with_a_model_configured_the_form_defaults_to_the_builtin_runtime(
    client: AsyncTestClient[Litestar], world: World
) -> None:
    body = {"model_base_url": "https://llm.example/v1", "model_name": "m"}
    r = await client.put("/api/v1/repos/ana/demo/task-settings", json=body, headers=world.h("ana"))
    assert r.status_code == 200, r.text
    page = read_form((await client.get(f"{PAGE}/", headers=world.h("ana"))).text)
    assert ("runtime", "builtin") in page.checked and "disabled" not in page["runtime-builtin"].attrs
    assert "runtime-builtin-why" not in page
    # A write collaborator who cannot open the settings is told who can fix what is missing.
    wendy = read_form((await client.get(f"{PAGE}/", headers=world.h("wendy"))).text)
    why = " ".join(wendy["runtime-claude-code-why"].text.split())
    assert "Anthropic model" in why and "A repository admin can set an endpoint in the task settings." in why
    assert "/settings/tasks/" not in str(wendy["runtime-claude-code-why"].attrs)


async def test_a_person_s_own_task_lists_need_a_sign_in(client: AsyncTestClient[Litestar]) -> None:
    for path in ("/tasks", "/tasks/awaiting-review"):
        r = await client.get(path, headers={"Accept": "text/html"}, follow_redirects=False)
        assert r.status_code in (303, 401), (path, r.status_code)
        assert r.status_code == 401 or "/signin" in r.headers["location"]
