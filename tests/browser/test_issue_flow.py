"""An issue handed to an agent in a real browser, as a team would: a person opens an issue, labels
it and assigns it to `demo-agent`; a task starts (a builtin-runtime run against a scripted model,
in the real sandbox) and the issue's timeline shows it; its pull request says `Fixes #1`; the
person's inbox says the work awaits review; a second person's `@demo-agent` comment on the pull
request sends the agent back to work on the same branch; the person approves and merges the pull
request, and the issue closes with the pull request named on its timeline."""

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, expect

from forge.accounts import accounts
from forge.db.audit import Actor
from forge.db.engine import Database
from tests.support.a11y import check_page
from tests.support.accounts import PASSWORD
from tests.support.browser import ForgeServer, run_async
from tests.support.browser_ui import add_collaborator, create_bot, create_repo, expect_task_state, runs_table, sign_in
from tests.support.model import ScriptedModel, reply, tool_call

pytestmark = [pytest.mark.browser, pytest.mark.docker]


@pytest.fixture
def model() -> Iterator[ScriptedModel]:
    turns = [
        tool_call("bash", {"command": "echo 'total = price * count' > cart.py"}, call_id="c1"),
        reply("Fixed."),
        tool_call("bash", {"command": "echo 'empty = 0' >> cart.py"}, call_id="c2"),
        reply("An empty cart totals 0."),
    ]
    with ScriptedModel(turns) as scripted:
        yield scripted


@pytest.fixture
def forge_settings(model: ScriptedModel) -> dict[str, Any]:
    return {"model_base_url": model.url, "model_name": "scripted"}


def _user(site: ForgeServer, login: str) -> None:
    async def go() -> None:
        db = Database(site.settings.effective_database_url)
        try:
            async with db.session(write=True) as s:
                await accounts.create_user(s, Actor.system("test"), login, PASSWORD)
        finally:
            await db.dispose()

    run_async(go())


def test_an_issue_assigned_to_an_agent_becomes_a_merged_fix(
    page: Page, browser: Browser, forge: ForgeServer, model: ScriptedModel, artifacts_dir: Path
) -> None:
    """Over 30 s under the parallel suite: two real sandbox runs between the pages."""
    sign_in(page, forge.url, forge.admin_login, forge.admin_password)
    create_bot(page, forge.url, "demo-agent")
    _user(forge, "bob")
    repo = create_repo(page, forge.url, "shop")
    add_collaborator(page, forge.url, repo, "demo-agent", "write")
    add_collaborator(page, forge.url, repo, "bob", "write")

    page.goto(f"{forge.url}/{repo}/labels")
    page.get_by_label("Name").fill("bug")
    page.get_by_role("button", name="Create label").click()
    check_page(page, artifacts_dir, "labels")
    page.goto(f"{forge.url}/{repo}/issues")
    page.get_by_role("link", name="New issue").click()
    page.get_by_label("Title").fill("Cart total is wrong")
    page.get_by_label(re.compile("^Description")).fill("The total ignores the count.")
    page.get_by_role("button", name="Open issue").click()
    expect(page.locator("#issue-title")).to_contain_text("Cart total is wrong #1")

    page.locator("#labels-form").get_by_label("bug").check()
    page.locator("#labels-form").get_by_role("button", name="Save labels").click()
    page.get_by_label(re.compile("^Assign")).fill("demo-agent")
    page.get_by_role("button", name="Save assignees").click()
    timeline = page.locator("#timeline")
    expect(timeline).to_contain_text("added the label bug")
    expect(timeline).to_contain_text("assigned demo-agent (an agent)")
    expect(timeline).to_contain_text("started task #1 (demo-agent)")

    check_page(page, artifacts_dir, "issue")
    page.locator("#linked").get_by_role("link", name="task #1").click()
    expect(page.locator("#trigger")).to_have_text("assigned issue #1")
    expect_task_state(page, "awaiting review")
    prompt = "\n".join(str(m.get("content")) for m in model.requests[0]["messages"])
    assert "> The total ignores the count." in prompt and "not an instruction from forgehand" in prompt

    page.goto(f"{forge.url}/{repo}/issues/1")
    expect(timeline).to_contain_text(re.compile(r"task #1\s+is ready for review"))
    expect(timeline).to_contain_text("mentioned this in pull request #2")  # its description: Fixes #1
    page.goto(f"{forge.url}/notifications")
    expect(page.locator("main")).to_contain_text("shop")
    check_page(page, artifacts_dir, "inbox")

    page.goto(f"{forge.url}/{repo}/pull/2")
    expect(page.locator("#description")).to_contain_text("Fixes #1")
    first_head = page.locator("#head-sha").inner_text()

    # A second person asks the agent for more on its pull request: a follow-up on the same branch.
    bob_context = browser.new_context()
    bob = bob_context.new_page()
    try:
        sign_in(bob, forge.url, "bob", PASSWORD)
        bob.goto(f"{forge.url}/{repo}/pull/2")
        bob.get_by_label("Comment (markdown)").fill("@demo-agent an empty cart should total 0, please.")
        bob.get_by_role("button", name="Comment", exact=True).click()
        expect(bob.locator("article.comment").last).to_contain_text("an empty cart should total 0")
    finally:
        bob_context.close()
    page.goto(f"{forge.url}/{repo}/tasks/1")
    expect_task_state(page, "awaiting review")
    expect(runs_table(page)).to_have_count(2)
    expect(page.locator("#transcript .ev-prompt").last).to_contain_text("an empty cart should total 0")
    page.goto(f"{forge.url}/{repo}/pull/2")
    expect(page.locator("#head-sha")).not_to_have_text(first_head)
    page.get_by_label("Approve").check()
    page.get_by_role("button", name="Submit review").click()
    page.get_by_role("button", name="Merge into main").click()
    expect(page.locator("#pull-state")).to_have_text("merged")

    page.goto(f"{forge.url}/{repo}/issues/1")
    expect(page.locator("#issue-state")).to_have_text("closed")
    page.goto(f"{forge.url}/{repo}/issues?state=all")
    check_page(page, artifacts_dir, "issues")
    page.goto(f"{forge.url}/{repo}/issues/1")
    expect(timeline).to_contain_text("closed this with pull request #2 as completed")
