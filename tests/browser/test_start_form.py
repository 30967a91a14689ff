"""The start form's runtimes as a team lead meets them: each one says in words what it is and how
its tool calls are checked; on a repository with no model endpoint the agents that need one are
offered disabled, with the reason and a link to the settings that fix it; only the chosen
runtime's own fields show (all of them, each under its heading, without JavaScript)."""

import re
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Locator, Page, expect

from forge.core.settings import Settings
from forge.db.engine import Database
from forge.repos import repositories
from tasks.core.models import RepoTaskSettings
from tests.support.a11y import check_page, no_foreign_requests
from tests.support.browser import ForgeServer, run_async
from tests.support.browser_keys import tab_to
from tests.support.browser_ui import add_collaborator, create_bot, create_repo, sign_in

pytestmark = [pytest.mark.browser]


async def set_repo_model(settings: Settings, full_name: str) -> None:
    """A model endpoint for the repository (a stored setting; nothing calls it in this test)."""
    owner, name = full_name.split("/")
    db = Database(settings.effective_database_url)
    try:
        async with db.session(write=True) as s:
            repo = await repositories.find(s, owner, name)
            assert repo is not None
            s.add(RepoTaskSettings(repo_id=repo.id, model_base_url="http://127.0.0.1:9/v1", model_name="m"))
    finally:
        await db.dispose()


def radio(page: Page, runtime: str) -> Locator:
    return page.locator(f"#start-form input[name=runtime][value='{runtime}']")


def choice(page: Page, runtime: str) -> Locator:
    """The runtime's box: its radio, what it is, and why it cannot run here."""
    return page.locator("#start-form .choice").filter(has=page.locator(f"input[name=runtime][value='{runtime}']"))


def test_runtimes_say_what_they_are_and_why_they_cannot_run(
    page: Page, forge: ForgeServer, browser: Browser, artifacts_dir: Path
) -> None:
    sign_in(page, forge.url, forge.admin_login, forge.admin_password)
    create_bot(page, forge.url, "fixer")
    repo = create_repo(page, forge.url, "plain")
    add_collaborator(page, forge.url, repo, "fixer", "write")

    with no_foreign_requests(page):
        page.goto(f"{forge.url}/{repo}/tasks/")
        form = page.locator("#start-form")
        # No model endpoint anywhere: only the command runtime can run, and it is the one chosen.
        expect(radio(page, "command")).to_be_checked()
        expect(radio(page, "command")).to_be_enabled()
        for runtime, card in (
            ("builtin", "model-settings"),
            ("claude-code", "anthropic-settings"),
            ("codex", "model-settings"),
        ):
            box = choice(page, runtime)
            expect(radio(page, runtime)).to_be_disabled()
            why = box.locator(".cannot-run")
            expect(why).to_contain_text(re.compile(r"Cannot run here: .*needs"))
            link = why.get_by_role("link", name="Set an endpoint in the task settings")
            expect(link).to_have_attribute("href", f"/{repo}/settings/tasks/#{card}")
            expect(radio(page, runtime)).to_have_accessible_description(re.compile(r"Cannot run here"))
        claude = choice(page, "claude-code")
        expect(claude).to_contain_text("Anthropic's Claude Code command-line agent")
        expect(claude).to_contain_text("the program asks forgehand before each tool call")
        expect(choice(page, "command")).to_contain_text("No model is called")
        expect(form).not_to_contain_text("gated by")
        expect(form).not_to_contain_text(re.compile(r"permission_requests|managed_hooks|control_channel|runner_loop"))

        # Only the chosen runtime's fields: the command's, not the ACP agents'.
        expect(form.get_by_label(re.compile(r"^\s*Command"))).to_be_visible()
        expect(form.locator("[data-runtime-fields=acp]")).to_be_hidden()
        check_page(page, artifacts_dir, "start-form-no-model")

        # The link leads to the card that sets the endpoint.
        choice(page, "claude-code").get_by_role("link").first.click()
        expect(page).to_have_url(re.compile(r"/settings/tasks/#anthropic-settings$"))
        expect(page.locator("#anthropic-settings")).to_be_in_viewport()

        # With an endpoint, the builtin agent is offered and chosen; by keyboard the choice moves
        # within the group and the command's field follows it.
        run_async(set_repo_model(forge.settings, repo))
        page.goto(f"{forge.url}/{repo}/tasks/")
        expect(radio(page, "builtin")).to_be_enabled()
        expect(radio(page, "builtin")).to_be_checked()
        expect(form.get_by_label(re.compile(r"^\s*Command"))).to_be_hidden()
        expect(radio(page, "claude-code")).to_be_disabled()  # still no Anthropic endpoint
        tab_to(page, "#start-form input[name=runtime]:checked")
        page.keyboard.press("ArrowUp")  # from the first radio round to the last: command
        expect(radio(page, "command")).to_be_checked()
        expect(form.get_by_label(re.compile(r"^\s*Command"))).to_be_visible()

    # Without JavaScript every runtime's fields show, each under its heading.
    plain = browser.new_context(java_script_enabled=False)
    try:
        bare = plain.new_page()
        sign_in(bare, forge.url, forge.admin_login, forge.admin_password)
        bare.goto(f"{forge.url}/{repo}/tasks/")
        expect(bare.get_by_role("heading", name="For the command runtime")).to_be_visible()
        expect(bare.get_by_role("heading", name="For the ACP runtime")).to_be_visible()
        expect(bare.locator("#start-form").get_by_label(re.compile(r"^\s*Command"))).to_be_visible()
    finally:
        plain.close()
