"""A custom tool from its definition to an agent's approved call, in a real browser (docs/tools.md,
"A worked example"): an admin defines `run_tests{pattern: string}` on a repository's Tools page
and activates it; a claude-code task (the real CLI in the agents image, a scripted Anthropic model
on 127.0.0.1) calls it; the call waits for approval on the task page; the admin approves it there;
the run's output reaches the agent; the tool's run history shows it."""

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from tests.support.anthropic import ScriptedAnthropic, text, tool_use
from tests.support.browser import ForgeServer
from tests.support.browser_ui import add_collaborator, create_bot, create_repo, sign_in, start_task
from tests.support.waiting import until_sync

pytestmark = [pytest.mark.browser, pytest.mark.docker]

KEY = "sk-ant-instance-key-claude-0123456789"
SCHEMA = '{"type": "object", "properties": {"pattern": {"type": "string", "maxLength": 200}}, "required": ["pattern"]}'
SCRIPT = 'echo "ran tests matching $FORGEHAND_ARG_PATTERN"'


@pytest.fixture
def api() -> Iterator[ScriptedAnthropic]:
    turns = [tool_use("mcp__forgehand__custom_run_tests", {"pattern": "test_parse"}, id="toolu_t"), text("Tests ran.")]
    with ScriptedAnthropic(turns) as scripted:
        yield scripted


@pytest.fixture
def forge_settings(api: ScriptedAnthropic, agents_image: str) -> dict[str, Any]:
    return {"anthropic_base_url": api.url, "anthropic_api_key": KEY, "anthropic_model": "claude-test"}


def define_run_tests(page: Page, forge: ForgeServer, full_name: str) -> str:
    page.goto(forge.at(f"/{full_name}/settings/tools/"))
    page.get_by_role("link", name="New tool").click()
    form = page.locator("#tool-form")
    form.get_by_label("Name", exact=True).fill("run_tests")
    form.get_by_label("Description", exact=True).fill("Run the tests matching a pattern")
    form.get_by_label("Parameters (JSON)").fill(SCHEMA)
    expect(page.locator("#parameters-check")).to_contain_text("Valid")
    form.get_by_label("Script", exact=True).fill(SCRIPT)
    page.get_by_role("button", name="Create tool").click()
    expect(page.get_by_role("heading", name="custom_run_tests")).to_be_visible()
    page.get_by_role("button", name="Activate version 1").click()
    expect(page.locator("#active-version")).to_have_text("1")
    return page.url.split("?")[0]


def test_an_agents_call_waits_on_the_task_page_and_runs_once_approved(
    page: Page, forge: ForgeServer, api: ScriptedAnthropic
) -> None:
    """Over 30 s under the parallel suite: a claude-code run in a real container, and the tool's
    own container once approved."""
    sign_in(page, forge.url, forge.admin_login, forge.admin_password)
    create_bot(page, forge.url, "fixer")
    full_name = create_repo(page, forge.url, "suite")
    add_collaborator(page, forge.url, full_name, "fixer", "write")
    tool_url = define_run_tests(page, forge, full_name)

    page.goto(forge.at(f"/{full_name}/tasks/"))
    expect(page.locator("#agent-tools")).to_contain_text("Custom tools the agent is offered here (1)")
    number = start_task(page, forge.url, full_name, goal="Run the parser tests", agent="fixer", runtime="claude-code")

    # The call waits for a person: its card is on the task page (a reload shows it once it is there).
    card = page.locator(".tool-run-approval")

    def card_shown() -> bool:
        page.reload()
        return card.count() == 1

    until_sync(card_shown, timeout=120, what="the run_tests call's approval card")
    expect(card.get_by_role("heading", level=2)).to_have_text("custom_run_tests (version 1) waits for your approval")
    expect(card.locator("pre.tool-run-inputs")).to_contain_text('"pattern": "test_parse"')
    card.get_by_role("button", name=re.compile(r"^Approve custom_run_tests")).click()
    expect(page).to_have_url(re.compile(rf"/{re.escape(full_name)}/tasks/{number}"))
    # A tool that changes nothing: the run ends in review with no changes.
    expect(page.locator("h1 .badge")).to_have_attribute("data-state", "awaiting_review", timeout=120_000)
    expect(page.locator(".tool-run-approval")).to_have_count(0)
    expect(page.locator("#transcript")).to_contain_text("ran tests matching test_parse")

    # The approved run's output reached the agent as the tool's result.
    results = [
        json.dumps(b["content"])
        for body in api.requests
        for m in body["messages"]
        if isinstance(m["content"], list)
        for b in m["content"]
        if b.get("type") == "tool_result" and b.get("tool_use_id") == "toolu_t"
    ]
    assert results and "ran tests matching test_parse" in results[-1]

    # The tool's run history shows it: succeeded, version 1, the task, who approved it.
    page.goto(tool_url)
    run = page.locator("#runs tbody tr").first
    expect(run).to_contain_text("succeeded")
    expect(run).to_contain_text(f"#{number}")
