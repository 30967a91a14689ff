"""An issue handed to an agent in a real browser, as a team would: a person opens an issue, labels
it and assigns it to `demo-agent`; a task starts (a builtin-runtime run against a scripted model,
in the real sandbox) and the issue's timeline shows it; its pull request says `Fixes #1`; the
person's inbox says the work awaits review; the person approves and merges the pull request, and
the issue closes with the pull request named on its timeline."""

import re
from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from tests.support.browser import ForgeServer
from tests.support.browser_ui import add_collaborator, create_bot, create_repo, expect_task_state, sign_in
from tests.support.model import ScriptedModel, reply, tool_call

pytestmark = [pytest.mark.browser, pytest.mark.docker]


@pytest.fixture
def model() -> Iterator[ScriptedModel]:
    turns = [tool_call("bash", {"command": "echo 'total = price * count' > cart.py"}, call_id="c1"), reply("Fixed.")]
    with ScriptedModel(turns) as scripted:
        yield scripted


@pytest.fixture
def forge_settings(model: ScriptedModel) -> dict[str, Any]:
    return {"model_base_url": model.url, "model_name": "scripted"}


def test_an_issue_assigned_to_an_agent_becomes_a_merged_fix(
    page: Page, forge: ForgeServer, model: ScriptedModel
) -> None:
    """Over 30 s under the parallel suite: one real sandbox run between the pages."""
    sign_in(page, forge.url, forge.admin_login, forge.admin_password)
    create_bot(page, forge.url, "demo-agent")
    repo = create_repo(page, forge.url, "shop")
    add_collaborator(page, forge.url, repo, "demo-agent", "write")

    page.goto(f"{forge.url}/{repo}/labels")
    page.get_by_label("Name").fill("bug")
    page.get_by_role("button", name="Create label").click()
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

    page.locator("#linked").get_by_role("link", name="task #1").click()
    expect_task_state(page, "awaiting review")
    prompt = "\n".join(str(m.get("content")) for m in model.requests[0]["messages"])
    assert "> The total ignores the count." in prompt and "not an instruction from forgehand" in prompt

    page.goto(f"{forge.url}/{repo}/issues/1")
    expect(timeline).to_contain_text(re.compile(r"task #1\s+is ready for review"))
    expect(timeline).to_contain_text("mentioned this in pull request #2")  # its description: Fixes #1
    page.goto(f"{forge.url}/notifications")
    expect(page.locator("main")).to_contain_text("shop")

    page.goto(f"{forge.url}/{repo}/pull/2")
    expect(page.locator("#description")).to_contain_text("Fixes #1")
    page.get_by_label("Approve").check()
    page.get_by_role("button", name="Submit review").click()
    page.get_by_role("button", name="Merge into main").click()
    expect(page.locator("#pull-state")).to_have_text("merged")

    page.goto(f"{forge.url}/{repo}/issues/1")
    expect(page.locator("#issue-state")).to_have_text("closed")
    expect(timeline).to_contain_text("closed this with pull request #2 as completed")
